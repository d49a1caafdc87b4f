// expect: octet formats are at most 8 bits wide
#include <octet/octet.hpp>
using too_wide = octet::float_format<5, 4>;
int main() {
    return too_wide::bits;
}
