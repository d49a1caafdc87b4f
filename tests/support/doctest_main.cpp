// Main for host tests: doctest's, plus the seed of this run's fresh random inputs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "support/random.hpp"

int main(int argc, char** argv) {
    std::printf("octet test seed: %llu (set OCTET_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(octet_test::run_seed()));
    doctest::Context context(argc, argv);
    return context.run();
}
