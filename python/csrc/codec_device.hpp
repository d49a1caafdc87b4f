// codec_device.hpp: the CUDA half of the codec ops (codec_encode.cpp, codec_decode.cpp), declared
// free of torch's headers and of device code, as device_ops.hpp does for the quantizer; defined by
// codec_device.cu (nvcc, no torch) through octet/codec/codec.cuh. Compiled only when the op
// libraries are built with CUDA (OCTET_TORCH_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "octet/codec/codec.hpp"
#include "octet/core/span.hpp"
#include "octet/cuda/executor.cuh"

namespace octet_torch::device {

/// octet::encode_gradient on ex's stream (enqueues; never synchronizes).
void encode_gradient(const octet::stream_executor& ex, const octet::codec_config& cfg, octet::span<const float> x,
                     octet::span<std::uint8_t> out, const octet::encode_options& opt);

/// octet::encode_gradient_transformed on ex's stream (enqueues; never synchronizes).
void encode_gradient_transformed(const octet::stream_executor& ex, const octet::codec_config& cfg,
                                 octet::span<const float> y, std::size_t n, octet::span<std::uint8_t> out,
                                 const octet::encode_options& opt);

/// octet::decode_gradient_synchronizing: validates the device message, reading its header and the
/// validation result on the host (SYNCHRONIZES the stream twice), throws octet::error on a bad
/// message, else decodes into out and returns the header.
octet::wire_header decode_gradient_synchronizing(const octet::stream_executor& ex,
                                                 octet::span<const std::uint8_t> message, octet::span<float> out);

/// octet::decode_gradient_transformed_synchronizing, as above (the transformed coordinates into y).
octet::wire_header decode_gradient_transformed_synchronizing(const octet::stream_executor& ex,
                                                             octet::span<const std::uint8_t> message,
                                                             octet::span<float> y);

}  // namespace octet_torch::device
