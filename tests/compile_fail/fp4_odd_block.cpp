// expect: sub-byte formats pack 2 (FP4) or 4 (FP6) codes
#include <octet/octet.hpp>
using bad = octet::recipe<octet::e2m1, octet::per_column, octet::scale::amax_ratio<0>>;
bad::format f;
