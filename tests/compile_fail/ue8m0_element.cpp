// expect: ue8m0 is a scale format
#include <octet/octet.hpp>
using bad = octet::recipe<octet::ue8m0, octet::block<1, 32>, octet::scale::pow2_floor>;
bad::format f;
