// The codec ops' CUDA half (codec_device.hpp): octet/codec/codec.cuh's stream forms.
#include "codec_device.hpp"
#include "octet/codec/codec.cuh"

namespace octet_torch::device {

void encode_gradient(const octet::stream_executor& ex, const octet::codec_config& cfg, octet::span<const float> x,
                     octet::span<std::uint8_t> out, const octet::encode_options& opt) {
    octet::encode_gradient(ex, cfg, x, out, opt);
}

void encode_gradient_transformed(const octet::stream_executor& ex, const octet::codec_config& cfg,
                                 octet::span<const float> y, std::size_t n, octet::span<std::uint8_t> out,
                                 const octet::encode_options& opt) {
    octet::encode_gradient_transformed(ex, cfg, y, n, out, opt);
}

octet::wire_header decode_gradient_synchronizing(const octet::stream_executor& ex,
                                                 octet::span<const std::uint8_t> message, octet::span<float> out) {
    return octet::decode_gradient_synchronizing(ex, message, out);
}

octet::wire_header decode_gradient_transformed_synchronizing(const octet::stream_executor& ex,
                                                             octet::span<const std::uint8_t> message,
                                                             octet::span<float> y) {
    return octet::decode_gradient_transformed_synchronizing(ex, message, y);
}

}  // namespace octet_torch::device
