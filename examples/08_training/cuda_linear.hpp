// examples/08_training/cuda_linear.hpp: the training program's FP8 linear layers on a CUDA GPU
// (`example_08_training --linears cuda`, in a build with CUDA; cuda_linear.cu).
//
// Each FP8 linear keeps its quantized copies and step state in an octet::cuda::linear_context on
// its own CUDA stream (octet/nn/linear.cuh): X, W and dY go to the device, Y, dX and dW come back,
// and the layer waits for its stream before it returns, so the rest of the program (attention, the
// optimizer, the codec, monitors and recovery) runs on the host unchanged. The stream context keeps
// the host context's rules (delayed scaling, the stochastic-rounding step, the statistics), so a
// run differs from the host's only where the device GEMM sums a segment in another order than the
// host's k order. The context's bytes (its memory(), as the host layer books its own) are booked in
// the run's meter: the ledger predicts bytes, wherever they live.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/model.hpp"
#include "train.hpp"

namespace train {

/// The name of the GPU the CUDA linears run on, or "" with *why saying why there is none.
std::string cuda_linear_device(std::string* why);

/// Why the linears of `mode` cannot run on CUDA ("" when they can): NVFP4 has no tensor-core GEMM
/// on Hopper without cuBLASLt.
std::string cuda_linear_refusal(linear_mode mode);

/// A linear of `mode` as make_linear_layer makes it, but for the FP8 modes on a CUDA stream
/// (float32 and bf16 stay on the host). Throws octet::error for a mode cuda_linear_refusal names
/// and when there is no CUDA device.
std::unique_ptr<linear_layer> make_cuda_linear_layer(memory_meter& m, linear_mode mode, std::size_t max_tokens, int in,
                                                     int out, std::uint64_t seed);

}  // namespace train
