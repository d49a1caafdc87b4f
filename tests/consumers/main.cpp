// A consumer of octet: the same source is built three ways (add_subdirectory, find_package after
// cmake --install, plain -I include) by tests/consumers/CMakeLists.txt.
#include <octet/octet.hpp>

#include <cstdio>

int main() {
    const std::uint8_t c = octet::encode<octet::e4m3>(3.3f);
    const float back = octet::decode<octet::e4m3>(c);
    std::printf("octet %s: e4m3(3.3) = 0x%02x -> %g\n", OCTET_VERSION_STRING, c, back);
    return (c == 0x45 && back == 3.25f) ? 0 : 1;
}
