// octet::decode_gradient(message, n, first_index) -> n float32
// octet::decode_gradient_transformed(message, n, format, transform, block, scale_block, seed, stochastic,
//                                    first_index) -> L float32 (rotated coordinates, no inverse transform)
// (octet/codec/codec.hpp). The whole message is validated first (octet/codec/wire.hpp: size, header,
// checksum, scales, padding); a message that fails, or that carries other elements than
// [first_index, first_index + n) (or, transformed, another configuration), raises ValueError. A CUDA
// message is decoded on the device by octet's synchronizing stream decoder: the header and the
// validation result are read on the host (two synchronizations), so the errors are the CPU op's.
#include "codec_torch.hpp"

namespace octet_torch {
namespace {

using octet::span;

/// Checks that a message carries elements [first_index, first_index + n). The header's count and
/// first index are read raw (wire.hpp offsets 32 and 24); the decode validates the whole message
/// once, and only a mismatch validates first, so that a corrupted message is reported as such.
void require_elements(const octet::wire_header& h, int64_t n, int64_t first_index, const char* op) {
    const std::uint64_t count = non_negative(n, op, "n"), first = non_negative(first_index, op, "first_index");
    TORCH_CHECK_VALUE(h.count == count && h.first_index == first, where(op, "message"), "carries elements [",
                      h.first_index, ", ", h.first_index + h.count, "); expected [", first, ", ", first + count,
                      ") (pass the n and first_index it was encoded with)");
}

void expect_elements(span<const std::uint8_t> m, int64_t n, int64_t first_index, const char* op) {
    const std::uint64_t count = non_negative(n, op, "n"), first = non_negative(first_index, op, "first_index");
    if (m.size() >= octet::wire_header_bytes && octet::load_le64(m.data() + 32) == count &&
        octet::load_le64(m.data() + 24) == first)
        return;
    require_elements(guarded([&] { return octet::read_wire_header(m); }), n, first_index, op);
}

#ifdef OCTET_TORCH_CUDA
/// A CUDA message's decode: octet's synchronizing stream decoder (the header and the validation are
/// read on the host, as the CPU op reads them), with the CPU op's errors: a message of other
/// elements (or configuration: `also`) is said so, from a host copy taken on that error path only.
template <class Decode, class Also>
octet::wire_header decode_on_cuda(const at::Tensor& message, int64_t n, int64_t first_index, const char* op,
                                  Decode&& decode, Also&& also) {
    const c10::cuda::CUDAGuard guard(message.device());
    octet::wire_header h;
    try {
        h = decode(device_executor(message));
    } catch (const octet::error& e) {
        const at::Tensor host_copy = message.cpu();
        const auto m = message_of(host_copy, op);
        expect_elements(m, n, first_index, op);
        also(guarded([&] { return octet::read_wire_header(m); }));
        TORCH_CHECK_VALUE(false, e.what());
    }
    require_elements(h, n, first_index, op);
    return h;
}
#endif

at::Tensor decode_gradient(const at::Tensor& message, int64_t n, int64_t first_index) {
    constexpr const char* op = "decode_gradient";
    const c10::DeviceType device = kernel_device(message, op, "message");
    const auto m = message_of(message, op, device);
    non_negative(n, op, "n");
    at::Tensor out = at::empty({n}, message.options().dtype(at::kFloat));
    const span<float> os(out.data_ptr<float>(), static_cast<std::size_t>(n));
    if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
        decode_on_cuda(
            message, n, first_index, op,
            [&](const octet::stream_executor& ex) { return device::decode_gradient_synchronizing(ex, m, os); },
            [](const octet::wire_header&) {});
#endif
    } else {
        expect_elements(m, n, first_index, op);
        guarded([&] { octet::decode_gradient(host(), m, os); });
    }
    return out;
}

at::Tensor decode_gradient_transformed(const at::Tensor& message, int64_t n, c10::string_view format,
                                       c10::string_view transform, int64_t block, int64_t scale_block, int64_t seed,
                                       bool stochastic, int64_t first_index) {
    constexpr const char* op = "decode_gradient_transformed";
    const c10::DeviceType device = kernel_device(message, op, "message");
    const auto m = message_of(message, op, device);
    const octet::codec_config cfg = codec_config_of(format, transform, block, scale_block, seed, stochastic, op);
    non_negative(n, op, "n");
    non_negative(first_index, op, "first_index");
    const octet::wire_layout l = guarded([&] { return octet::wire_layout_of(cfg, static_cast<std::uint64_t>(n)); });
    // Summing in rotated coordinates is only meaningful between messages of one configuration.
    auto check_config = [&](const octet::wire_header& h) {
        const bool same = h.format == cfg.format && h.transform == cfg.transform && h.block == l.block &&
                          h.scale_block == l.scale_block && h.seed == cfg.seed && h.stochastic == cfg.stochastic;
        TORCH_CHECK_VALUE(same, where(op, "message"), "was encoded with another configuration (format ",
                          octet::wire_format_name(h.format), ", transform ", octet::transform_name(h.transform),
                          ", block ", h.block, ", scale block ", h.scale_block, ", seed ", h.seed, ", stochastic ",
                          h.stochastic, ") than the one passed");
    };
    at::Tensor out = at::empty({static_cast<int64_t>(l.coded)}, message.options().dtype(at::kFloat));
    const span<float> y(out.data_ptr<float>(), static_cast<std::size_t>(l.coded));
    if (device == c10::DeviceType::CUDA) {
#ifdef OCTET_TORCH_CUDA
        check_config(decode_on_cuda(
            message, n, first_index, op,
            [&](const octet::stream_executor& ex) {
                return device::decode_gradient_transformed_synchronizing(ex, m, y);
            },
            check_config));
#endif
        return out;
    }
    expect_elements(m, n, first_index, op);
    octet::wire_header h;
    try {
        h = octet::decode_gradient_transformed(host(), m, y);  // validates the whole message once
    } catch (const octet::error& e) {
        // Say why: a corrupted message, or a valid one of another configuration (another L).
        check_config(guarded([&] { return octet::read_wire_header(m); }));
        TORCH_CHECK_VALUE(false, e.what());
    }
    check_config(h);
    return out;
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def("decode_gradient(Tensor message, int n, int first_index=0) -> Tensor");
    m.def(
        "decode_gradient_transformed(Tensor message, int n, str format=\"e4m3\", str transform=\"hadamard\", int "
        "block=1024, int scale_block=0, int seed=0, bool stochastic=False, int first_index=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("decode_gradient", &octet_torch::decode_gradient);
    m.impl("decode_gradient_transformed", &octet_torch::decode_gradient_transformed);
}

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("decode_gradient", &octet_torch::decode_gradient);
    m.impl("decode_gradient_transformed", &octet_torch::decode_gradient_transformed);
}
