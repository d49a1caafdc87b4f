// expect: round::stochastic takes 32 random bits
#include <octet/octet.hpp>
int main() {
    return octet::encode<octet::e4m3, octet::round::stochastic>(1.0f);
}
