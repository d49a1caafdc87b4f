// gemm_pairs.hpp: the recipe pairs the scaled_mm op serves (A's recipe, B's recipe), as lists that
// the name dispatch (gemm_fp8.cpp, gemm_narrow.cpp) and the CUDA instantiations (gemm_device_*.cu)
// both expand. Free of torch's headers.
#pragma once

/// X(ra, rb) for the per-tensor, per-row and DeepSeek-V3 block pairs (gemm_fp8.cpp).
#define OCTET_TORCH_GEMM_PAIRS_FP8(X)     \
    X(tensorwise_e4m3, tensorwise_e4m3)   \
    X(tensorwise_e4m3, tensorwise_e5m2)   \
    X(tensorwise_e5m2, tensorwise_e4m3)   \
    X(tensorwise_e5m2, tensorwise_e5m2)   \
    X(rowwise_e4m3, rowwise_e4m3)         \
    X(blockwise_1x128, blockwise_128x128) \
    X(blockwise_1x128, blockwise_1x128)

/// X(ra, rb) for the MX and NVFP4 pairs (gemm_narrow.cpp).
#define OCTET_TORCH_GEMM_PAIRS_NARROW(X) \
    X(mxfp8_e4m3, mxfp8_e4m3)            \
    X(mxfp8_e4m3, mxfp8_e5m2)            \
    X(mxfp8_e5m2, mxfp8_e4m3)            \
    X(mxfp8_e5m2, mxfp8_e5m2)            \
    X(mxfp6_e2m3, mxfp6_e2m3)            \
    X(mxfp6_e3m2, mxfp6_e3m2)            \
    X(mxfp4, mxfp4)                      \
    X(nvfp4, nvfp4)
