// The cast op's CUDA half for octet::bf16 inputs (quant_cast_device.hpp).
#include "quant_cast_device.cuh"

template void octet_torch::device::cast<octet::bf16>(const octet::stream_executor&, std::string_view, std::string_view,
                                                     std::string_view, octet::span<const octet::bf16>,
                                                     octet::span<std::uint8_t>, octet::philox_stream);
