// The quantizer (octet/quant/quantize.hpp) as a torch op:
//   octet::quantize(x, recipe, rowwise, columnwise, tensor_amax, rounding, seed, offset, collect_stats)
//       -> (codes, scales, tensor_scale, codes_t, scales_t, tensor_scale_t, amax, stats)
// and octet::recipe_info(recipe), what Python needs to compute a copy's layout (fake kernels).
// stats is float64 [2, 8] with collect_stats (else empty, [0]): per copy (row-wise, column-wise)
// amax, elements, saturated, flushed_to_zero, non_finite, lost_to_nan, signal_energy,
// noise_energy (quant/stats.hpp).
#include <ATen/ops/zeros.h>

#include <array>

#include "octet/quant/quantize.hpp"
#include "octet_torch.hpp"

namespace octet_torch {
namespace {

using octet::span;

using quantize_outputs =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

quantize_outputs quantize(const at::Tensor& x, c10::string_view recipe, bool rowwise, bool columnwise,
                          double tensor_amax, c10::string_view rounding, int64_t seed, int64_t offset,
                          bool collect_stats) {
    check_tensor(x, "quantize", "x", float_inputs);
    TORCH_CHECK_VALUE(rowwise || columnwise, where("quantize", "rowwise/columnwise"),
                      "are both False; ask for at least one copy");
    TORCH_CHECK_VALUE(rounding == "nearest_even" || rounding == "stochastic", where("quantize", "rounding"), "is '",
                      std::string(rounding), "'; quantize rounds nearest_even or stochastic");
    const octet::matrix_ref<const std::uint8_t> shape_only = as_matrix<const std::uint8_t>(x, "quantize", "x");
    const std::size_t rows = shape_only.rows, cols = shape_only.cols;
    const at::TensorOptions o = x.options();
    return with_recipe(recipe, "quantize", [&](auto rt) -> quantize_outputs {
        using Base = typename decltype(rt)::type;
        return with_rounding(rounding, "quantize", [&](auto rd) -> quantize_outputs {
            using Round = typename decltype(rd)::type;
            if constexpr (!std::is_same_v<Round, octet::round::nearest_even> &&
                          !std::is_same_v<Round, octet::round::stochastic>) {
                TORCH_CHECK_VALUE(false, "unreachable");
            } else {
                using R = with_rounding_t<Base, Round>;
                copy_tensors<R> row(rowwise ? rows : 0, rowwise ? cols : 0, o);
                copy_tensors<R> col(columnwise ? cols : 0, columnwise ? rows : 0, o);
                // Only when asked: every output tensor costs the small-call path (op_overhead.py).
                at::Tensor stats =
                    collect_stats ? at::zeros({2, 8}, o.dtype(at::kDouble)) : at::empty({0}, o.dtype(at::kDouble));
                at::Tensor amax = at::empty({}, o.dtype(at::kFloat));
                octet::quantize_options opt;
                opt.collect_stats = collect_stats;
                opt.tensor_amax = static_cast<float>(tensor_amax);
                opt.rng = {static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(offset)};
                const octet::quantize_result res = with_input(x, [&](auto in) {
                    using In = typename decltype(in)::type;
                    const auto xm = as_matrix<const In>(x, "quantize", "x");
                    // Stochastic rounding is what gradients get; they come as float32 or bf16
                    // (one fewer instantiation per recipe keeps the build short).
                    if constexpr (std::is_same_v<Round, octet::round::stochastic> && std::is_same_v<In, octet::fp16>) {
                        TORCH_CHECK_TYPE(false, where("quantize", "x"),
                                         "is float16; stochastic rounding takes float32 or bfloat16 input");
                        return octet::quantize_result{};
                    } else {
                        return guarded([&] {
                            return octet::quantize<R>(host(), xm, rowwise ? row.ref() : octet::quantized_ref<R>{},
                                                      columnwise ? col.ref() : octet::quantized_ref<R>{}, opt);
                        });
                    }
                });
                *amax.data_ptr<float>() = res.amax;
                if (collect_stats) {
                    put_quant_stats(stats.data_ptr<double>(), res.rowwise);
                    put_quant_stats(stats.data_ptr<double>() + 8, res.columnwise);
                }
                return {row.codes, row.scales, row.tensor_scale, col.codes, col.scales, col.tensor_scale, amax, stats};
            }
        });
    });
}

/// What Python needs to lay out a copy without running the quantizer (fake kernels, QuantizedTensor):
/// [format id, bits, block rows, block cols (0 = full), scale storage id, two-level], with format ids
/// in the order of format_names and scale storage 0 f32, 1 ue8m0, 2 e4m3.
std::vector<int64_t> recipe_info(c10::string_view recipe) {
    return with_recipe(recipe, "recipe_info", [&](auto rt) {
        using R = typename decltype(rt)::type;
        using G = typename R::granularity;
        using St = typename R::scale_storage_type;
        const std::string_view fmt = octet::format_name<typename R::format>();
        int64_t format_id = 0;
        while (format_id < 8 && format_names[format_id] != fmt) ++format_id;
        const int64_t storage = std::is_same_v<St, octet::scale_storage::ue8m0>  ? 1
                                : std::is_same_v<St, octet::scale_storage::e4m3> ? 2
                                                                                 : 0;
        return std::vector<int64_t>{
            format_id, R::format::bits,     static_cast<int64_t>(G::rows), static_cast<int64_t>(G::cols),
            storage,   R::two_level ? 1 : 0};
    });
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "quantize(Tensor x, str recipe, bool rowwise=True, bool columnwise=False, float tensor_amax=-1.0, str "
        "rounding=\"nearest_even\", int seed=0, int offset=0, bool collect_stats=False) -> (Tensor codes, Tensor "
        "scales, Tensor tensor_scale, Tensor codes_t, Tensor scales_t, Tensor tensor_scale_t, Tensor amax, Tensor "
        "stats)");
    m.def("recipe_info(str recipe) -> int[]");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("quantize", &octet_torch::quantize);
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("recipe_info", &octet_torch::recipe_info);
}
