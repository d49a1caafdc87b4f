// quant_cast_device.hpp: the CUDA half of the cast and decode ops (quant_cast.cpp), declared free of
// torch's headers; quant_device_cast_<input>.cu (nvcc, no torch) define them through
// octet/format/convert.cuh, dispatching the names over format_list.hpp's lists. Compiled only when
// the op libraries are built with CUDA (OCTET_TORCH_CUDA).
#pragma once

#include <cstdint>
#include <string_view>

#include "octet/core/philox.hpp"
#include "octet/core/span.hpp"
#include "octet/cuda/executor.cuh"

namespace octet_torch::device {

/// octet::encode_array<format, rounding, overflow> on ex's stream (one kernel; never synchronizes).
/// The names are the cast op's, already checked (a combination cast_serves refuses throws).
template <class In>
void cast(const octet::stream_executor& ex, std::string_view format, std::string_view rounding,
          std::string_view overflow, octet::span<const In> in, octet::span<std::uint8_t> out, octet::philox_stream rng);

/// octet::decode_array<format> on ex's stream (one kernel; never synchronizes).
void decode(const octet::stream_executor& ex, std::string_view format, octet::span<const std::uint8_t> codes,
            octet::span<float> out);

}  // namespace octet_torch::device
