// codec_torch.hpp: what the codec ops (codec_*.cpp) share: the codec configuration as the plain
// arguments Python passes (format, transform, block, scale_block, seed, stochastic), checked and
// turned into octet::codec_config (octet/codec/wire.hpp).
#pragma once

#include <ATen/MemoryOverlap.h>

#include <cstdint>
#include <string>

#include "octet/codec/codec.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "codec_device.hpp"
#include "octet_torch_cuda.hpp"
#endif

namespace octet_torch {

inline octet::wire_format wire_format_of(c10::string_view name, const char* op) {
    if (name == "e4m3") return octet::wire_format::e4m3;
    if (name == "e5m2") return octet::wire_format::e5m2;
    if (name == "mxfp8") return octet::wire_format::mxfp8;
    if (name == "nvfp4") return octet::wire_format::nvfp4;
    TORCH_CHECK_VALUE(false, where(op, "format"), "is '", std::string(name), "'; pass e4m3, e5m2, mxfp8 or nvfp4");
}

inline octet::transform_kind transform_of(c10::string_view name, const char* op) {
    if (name == "hadamard") return octet::transform_kind::hadamard;
    if (name == "identity") return octet::transform_kind::identity;
    TORCH_CHECK_VALUE(false, where(op, "transform"), "is '", std::string(name), "'; pass hadamard or identity");
}

/// A count or index argument that must be >= 0 (Python ints are int64; octet's are unsigned).
inline std::uint64_t non_negative(int64_t v, const char* op, const char* arg) {
    TORCH_CHECK_VALUE(v >= 0, where(op, arg), "is ", v, "; pass a value >= 0");
    return static_cast<std::uint64_t>(v);
}

/// The configuration from Python's arguments, validated (octet::error -> ValueError naming it).
/// The seed is a 64-bit pattern: a negative Python int stands for seed + 2^64.
inline octet::codec_config codec_config_of(c10::string_view format, c10::string_view transform, int64_t block,
                                           int64_t scale_block, int64_t seed, bool stochastic, const char* op) {
    octet::codec_config c;
    c.format = wire_format_of(format, op);
    c.transform = transform_of(transform, op);
    TORCH_CHECK_VALUE(block >= 0 && block <= UINT32_MAX, where(op, "block"), "is ", block,
                      "; pass a power of two in [16, 32768]");
    TORCH_CHECK_VALUE(scale_block >= 0 && scale_block <= UINT32_MAX, where(op, "scale_block"), "is ", scale_block,
                      "; pass 0 (the format's own) or a power of two in [16, 32768]");
    c.block = static_cast<std::uint32_t>(block);
    c.scale_block = static_cast<std::uint32_t>(scale_block);
    c.seed = static_cast<std::uint64_t>(seed);
    c.stochastic = stochastic;
    guarded([&] { octet::detail::validate_config(c, (std::string("octet::") + op).c_str()); });
    return c;
}

/// A residual tensor's storage (by dtype: float32 f32, bfloat16 bf16, uint8 the e4m3 block layout
/// of feedback.hpp) as a view of n elements; checked, never copied. x is the tensor it must not overlap.
inline octet::residual_view residual_of(const at::Tensor& r, std::size_t n, const at::Tensor& x, const char* op) {
    check_tensor(r, op, "residual", {at::kFloat, at::kBFloat16, at::kByte}, x.device().type());
    check_vector(r, op, "residual");
    const octet::residual_storage s = r.scalar_type() == at::kFloat      ? octet::residual_storage::f32
                                      : r.scalar_type() == at::kBFloat16 ? octet::residual_storage::bf16
                                                                         : octet::residual_storage::e4m3;
    const auto need = static_cast<int64_t>(octet::residual_bytes(s, n));
    TORCH_CHECK_VALUE(r.numel() * r.element_size() == need, where(op, "residual"), "holds ",
                      r.numel() * r.element_size(), " bytes; a ", octet::residual_storage_name(s), " residual of ", n,
                      " elements holds ", need, " (float32/bfloat16: one per element; uint8: the e4m3 layout)");
    TORCH_CHECK_VALUE(n == 0 || at::get_overlap_status(r, x) == at::MemOverlapStatus::No, where(op, "residual"),
                      "overlaps the input; pass a separate tensor");
    return octet::residual_view{s, static_cast<std::uint8_t*>(r.data_ptr()), n};
}

/// A 1-D contiguous uint8 message on `device`.
inline octet::span<const std::uint8_t> message_of(const at::Tensor& m, const char* op,
                                                  c10::DeviceType device = c10::DeviceType::CPU) {
    check_tensor(m, op, "message", {at::kByte}, device);
    TORCH_CHECK_VALUE(m.dim() == 1 && m.is_contiguous(), where(op, "message"),
                      "must be a contiguous 1-D uint8 tensor (shape ", m.sizes(), ")");
    return {static_cast<const std::uint8_t*>(m.data_ptr()), static_cast<std::size_t>(m.numel())};
}

}  // namespace octet_torch
