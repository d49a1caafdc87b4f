// Main for CUDA tests. Test cases in TEST_SUITE("cuda") run anywhere (host code built by nvcc);
// those in TEST_SUITE("gpu") need a device: without one, the gpu run prints why and returns 77,
// which CTest reports as "skipped" (SKIP_RETURN_CODE), never as passed. Built in interpret mode
// (OCTET_INTERPRET), the device is the interpreter.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "octet/config.hpp"  // interpret mode: the runtime calls reach the interpreter (force-included)
#include "support/random.hpp"

int main(int argc, char** argv) {
    bool wants_gpu = false;
    for (int i = 1; i < argc; ++i)
        if (std::strcmp(argv[i], "--test-suite=gpu") == 0 || std::strcmp(argv[i], "-ts=gpu") == 0) wants_gpu = true;
    if (wants_gpu) {
        int count = 0;
        const cudaError_t err = cudaGetDeviceCount(&count);
        if (err != cudaSuccess || count == 0) {
            std::printf("SKIPPED: no CUDA device (%s); the gpu suite needs one\n",
                        err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
            return 77;
        }
        cudaDeviceProp prop{};
        cudaGetDeviceProperties(&prop, 0);
        std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    }
    std::printf("octet test seed: %llu (set OCTET_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(octet_test::run_seed()));
    doctest::Context context(argc, argv);
    return context.run();
}
