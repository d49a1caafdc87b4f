// octet/cuda/executor.cuh: the CUDA stream executor, octet::on_stream(stream).
#pragma once

#include <cuda_runtime.h>

#include "octet/core/executor.hpp"

namespace octet {

struct stream_executor {
    cudaStream_t stream = nullptr;
};

inline stream_executor on_stream(cudaStream_t stream = nullptr) { return stream_executor{stream}; }

}  // namespace octet
