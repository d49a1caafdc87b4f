// expect: has neither Inf nor NaN
#include <octet/octet.hpp>
int main() {
    return octet::encode<octet::e2m1, octet::round::nearest_even, octet::overflow::to_nonfinite>(1.0f);
}
