// The cast op's CUDA half for float inputs (quant_cast_device.hpp).
#include "quant_cast_device.cuh"

template void octet_torch::device::cast<float>(const octet::stream_executor&, std::string_view, std::string_view,
                                               std::string_view, octet::span<const float>, octet::span<std::uint8_t>,
                                               octet::philox_stream);

namespace octet_torch::device {

void decode(const octet::stream_executor& ex, std::string_view format, octet::span<const std::uint8_t> codes,
            octet::span<float> out) {
    cast_detail::with_format(format, [&](auto f) { octet::decode_array<typename decltype(f)::type>(ex, codes, out); });
}

}  // namespace octet_torch::device
