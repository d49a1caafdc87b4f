// The quantizer (octet/quant/quantize.hpp) as a torch op:
//   octet::quantize(x, recipe, rowwise, columnwise, tensor_amax, rounding, seed, offset, collect_stats,
//                   amax_history, philox)
//       -> [codes, scales, (tensor_scale), codes_t, scales_t, (tensor_scale_t), amax, (stats)]
// and octet::recipe_info(recipe), what Python needs to compute a copy's layout (fake kernels), and
// octet::recipe_names(), the recipes it takes.
// The list holds only what was asked for, in this order: the row-wise copy (when rowwise), the
// column-wise copy of x^T (when columnwise), each with its tensor_scale only for two-level recipes
// (NVFP4); amax (0-d float32, x's amax over finite inputs); stats only with collect_stats, float64
// [2, 8]: per copy (row-wise, column-wise; zeros for one not made) amax, elements, saturated,
// flushed_to_zero, non_finite, lost_to_nan, signal_energy, noise_energy (quant/stats.hpp).
// (A fixed tuple of eight, empty where nothing was asked, cost 0.5-0.7 us per empty tensor in the
// small-call path: bench/RESULTS.md, PyTorch embedding.)
// amax_history (float32, 1-D) and philox (int64 [2]: seed, offset) are the tensor-valued forms of
// tensor_amax and seed/offset: per-step values that torch.compile then keeps out of its guards.
// A history whose max is positive scales with that max (delayed scaling); an all-zero (or NaN)
// history scales with x's own amax (current scaling), as tensor_amax = -1 does.
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cstddef>

#include <limits>
#include <optional>
#include <tuple>

#include "octet/quant/quantize.hpp"
#include "octet_torch.hpp"
#include "quant_quantize_instances.hpp"
#ifdef OCTET_TORCH_CUDA
#include "device_ops.hpp"
#include "octet_torch_cuda.hpp"
#endif

// The quantizer itself is instantiated in the shards quant_quantize_<shard>.cpp (registry.hpp).
OCTET_TORCH_QUANTIZE_SHARDS(OCTET_TORCH_QUANTIZE_EXTERN_SHARD)

namespace octet_torch {
namespace {

using octet::span;

using quantize_outputs = std::vector<at::Tensor>;

quantize_outputs quantize(const at::Tensor& x, c10::string_view recipe, bool rowwise, bool columnwise,
                          double tensor_amax, c10::string_view rounding, int64_t seed, int64_t offset,
                          bool collect_stats, const std::optional<at::Tensor>& amax_history,
                          const std::optional<at::Tensor>& philox) {
    const c10::DeviceType device = kernel_device(x, "quantize", "x");
    const bool on_cuda = device == c10::DeviceType::CUDA;
    check_tensor(x, "quantize", "x", float_inputs, device);
    // The history and the Philox pair are read by the host, so they stay on the CPU with any x.
    auto host_read = [](const std::optional<at::Tensor>& t, const char* arg) {
        TORCH_CHECK_VALUE(!t || !t->defined() || t->is_cpu(), where("quantize", arg), "is on ", t->device(),
                          "; it is read on the host before the kernels are enqueued: keep it on the CPU");
    };
    host_read(amax_history, "amax_history");
    host_read(philox, "philox");
    // Checked here for both devices: the CUDA kernels would take an Inf as the scale's amax and a
    // NaN as "measure", where the host path refuses both (history_amax refuses a history's Inf).
    TORCH_CHECK_VALUE(tensor_amax == tensor_amax && !(tensor_amax > std::numeric_limits<float>::max()),
                      where("quantize", "tensor_amax"), "holds ", tensor_amax,
                      "; pass a finite amax (or a negative value to measure it)");
    if (amax_history) {
        TORCH_CHECK_VALUE(tensor_amax < 0, where("quantize", "amax_history"),
                          "is given together with tensor_amax; pass one of them");
        tensor_amax = history_amax(*amax_history, "quantize", "amax_history");
    }
    if (philox) std::tie(seed, offset) = philox_pair(*philox, "quantize");
    TORCH_CHECK_VALUE(rowwise || columnwise, where("quantize", "rowwise/columnwise"),
                      "are both False; ask for at least one copy");
    TORCH_CHECK_VALUE(rounding == "nearest_even" || rounding == "stochastic", where("quantize", "rounding"), "is '",
                      std::string(rounding), "'; quantize rounds nearest_even or stochastic");
    // On the host a zero tensor_amax is refused where x holds a non-zero value; the device cannot
    // look without a synchronization, so it refuses the value itself.
    TORCH_CHECK_VALUE(!on_cuda || tensor_amax != 0.0, where("quantize", "tensor_amax"),
                      "is 0 for a CUDA tensor; pass the positive amax to scale with, or -1 to measure it");
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
                return {};
            } else {
                using R = with_rounding_t<Base, Round>;
                std::optional<copy_tensors<R>> row, col;
                if (rowwise) row.emplace(rows, cols, o);
                if (columnwise) col.emplace(cols, rows, o);
                const auto row_ref = row ? row->ref() : octet::quantized_ref<R>{};
                const auto col_ref = col ? col->ref() : octet::quantized_ref<R>{};
                const octet::philox_stream rng{static_cast<std::uint64_t>(seed), static_cast<std::uint64_t>(offset)};
                at::Tensor amax, stats;
                with_input(x, [&](auto in) {
                    using In = typename decltype(in)::type;
                    const auto xm = as_matrix<const In>(x, "quantize", "x");
                    // Stochastic rounding is what gradients get; they come as float32 or bf16
                    // (one fewer instantiation per recipe keeps the build short).
                    if constexpr (std::is_same_v<Round, octet::round::stochastic> && std::is_same_v<In, octet::fp16>) {
                        TORCH_CHECK_TYPE(false, where("quantize", "x"),
                                         "is float16; stochastic rounding takes float32 or bfloat16 input");
                    } else if (on_cuda) {
#ifdef OCTET_TORCH_CUDA
                        const c10::cuda::CUDAGuard guard(x.device());
                        amax = at::zeros({}, o.dtype(at::kFloat));
                        at::Tensor raw_stats, amax_in;
                        device::quantize_args args;
                        args.amax = amax.data_ptr<float>();
                        args.rng = rng;
                        if (collect_stats) {
                            raw_stats =
                                at::empty({2, static_cast<int64_t>(sizeof(octet::quant_stats))}, o.dtype(at::kByte));
                            args.stats = static_cast<octet::quant_stats*>(raw_stats.data_ptr());
                        }
                        if (tensor_amax >= 0) {
                            amax_in = at::full({1}, tensor_amax, o.dtype(at::kFloat));
                            args.tensor_amax = amax_in.data_ptr<float>();
                        }
                        guarded([&] { device::quantize<R, In>(device_executor(x), xm, row_ref, col_ref, args); });
                        if (collect_stats) stats = stats_from_device(raw_stats);
#endif
                    } else {
                        octet::quantize_options opt;
                        opt.collect_stats = collect_stats;
                        opt.tensor_amax = static_cast<float>(tensor_amax);
                        opt.rng = rng;
                        const octet::quantize_result res =
                            guarded([&] { return octet::quantize<R>(host(), xm, row_ref, col_ref, opt); });
                        amax = at::empty({}, o.dtype(at::kFloat));
                        *amax.data_ptr<float>() = res.amax;
                        if (collect_stats) {
                            stats = at::zeros({2, 8}, o.dtype(at::kDouble));
                            put_quant_stats(stats.data_ptr<double>(), res.rowwise);
                            put_quant_stats(stats.data_ptr<double>() + 8, res.columnwise);
                        }
                    }
                });
                quantize_outputs out;
                out.reserve(8);
                for (auto* c : {&row, &col}) {
                    if (!*c) continue;
                    out.push_back((*c)->codes);
                    out.push_back((*c)->scales);
                    if constexpr (R::two_level) out.push_back((*c)->tensor_scale);
                }
                out.push_back(amax);
                if (collect_stats) out.push_back(stats);
                return out;
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

/// The recipe names the ops take, in registry.hpp's order (octet.torch.RECIPES).
std::vector<std::string> recipe_names_op() {
    return name_list(recipe_names);
}

/// Whether this build of the op libraries has CUDA kernels (OCTET_TORCH_CUDA).
bool cuda_kernels() {
#ifdef OCTET_TORCH_CUDA
    return true;
#else
    return false;
#endif
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "quantize(Tensor x, str recipe, bool rowwise=True, bool columnwise=False, float tensor_amax=-1.0, str "
        "rounding=\"nearest_even\", int seed=0, int offset=0, bool collect_stats=False, Tensor? amax_history=None, "
        "Tensor? philox=None) -> Tensor[]");
    m.def("recipe_info(str recipe) -> int[]");
    m.def("recipe_names() -> str[]");
    m.def("cuda_kernels() -> bool");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("quantize", &octet_torch::quantize);
}

// Without CUDA kernels the same function answers a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("quantize", &octet_torch::quantize);
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("recipe_info", &octet_torch::recipe_info);
    m.impl("recipe_names", &octet_torch::recipe_names_op);
    m.impl("cuda_kernels", &octet_torch::cuda_kernels);
}
