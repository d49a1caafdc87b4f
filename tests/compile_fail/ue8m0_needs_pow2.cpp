// expect: scale_storage::ue8m0 holds powers of two
#include <octet/octet.hpp>
using bad = octet::recipe<octet::e4m3, octet::block<1, 32>, octet::scale::amax_ratio<0>, octet::scale_storage::ue8m0>;
bad::format f;
