// The quantized linear layer's two torch ops (linear_common.hpp): argument checks that need no
// recipe, the recipe dispatch, the registration (CPU and CUDA) and the query ops that give Python
// the linear recipes:
//   octet::linear_recipe_names() -> str[]        registry.hpp's OCTET_TORCH_LINEAR_RECIPES, in order
//   octet::linear_recipe_info(recipe) -> (str x, str w, str g, bool delayed, bool stochastic_gradients,
//                                         bool hadamard_wgrad, bool on_cuda)
//       x, w, g: the octet::recipes names of its activation, weight and output-gradient recipes.
// Each recipe is instantiated in its own shard linear_<recipe>.cpp, and its CUDA half in
// linear_device_<recipe>.cu (generated from the list).
#include "linear_common.hpp"

OCTET_TORCH_LINEAR_RECIPES(OCTET_TORCH_LINEAR_EXTERN_SHARD)

namespace octet_torch::linear {
namespace {

/// Calls f(type_tag<octet::linear_recipes::name>{}) for a linear recipe's name.
template <class F>
decltype(auto) with_linear_recipe(std::string_view name, const char* op, F&& f) {
#define OCTET_TORCH_LINEAR_RECIPE(n, on_cuda) \
    if (name == #n) return f(type_tag<octet::linear_recipes::n>{});
    OCTET_TORCH_LINEAR_RECIPES(OCTET_TORCH_LINEAR_RECIPE)
#undef OCTET_TORCH_LINEAR_RECIPE
    TORCH_CHECK_VALUE(false, where(op, "recipe"), "is '", std::string(name), "'; pass one of ",
                      joined(linear_recipe_names));
}

/// The name Python passes for a named recipe (octet::recipes::<name>).
template <class R>
std::string recipe_name() {
#define OCTET_TORCH_RECIPE_NAME(n) \
    if constexpr (std::is_same_v<R, octet::recipes::n>) return #n;
    OCTET_TORCH_RECIPES(OCTET_TORCH_RECIPE_NAME)
#undef OCTET_TORCH_RECIPE_NAME
    return "";
}

std::vector<std::string> linear_recipe_names_op() {
    return name_list(linear_recipe_names);
}

std::tuple<std::string, std::string, std::string, bool, bool, bool, bool> linear_recipe_info(c10::string_view recipe) {
    return with_linear_recipe(recipe, "linear_recipe_info", [](auto t) {
        using LR = typename decltype(t)::type;
        return std::make_tuple(recipe_name<typename LR::x_recipe>(), recipe_name<typename LR::w_recipe>(),
                               recipe_name<typename LR::g_recipe>(), LR::scaling == octet::linear_scaling::delayed,
                               LR::stochastic_gradients, LR::hadamard_wgrad, linear_on_cuda<LR>);
    });
}

/// A history is the tensor form of delayed scaling: only a delayed recipe takes one.
template <class LR>
float scale_amax(const std::optional<at::Tensor>& history, const char* op, const char* arg) {
    if (!history) return -1.0f;
    TORCH_CHECK_VALUE(LR::scaling == octet::linear_scaling::delayed, where(op, arg),
                      "is given for a recipe with current scaling; pass None (only tensorwise_delayed keeps "
                      "amax histories)");
    return history_amax(*history, op, arg);
}

std::vector<at::Tensor> linear_forward(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                                       c10::string_view recipe, const std::optional<at::Tensor>& x_history,
                                       const std::optional<at::Tensor>& w_history, int64_t seed, bool save_x_t,
                                       bool save_w_t, bool keep_operands, bool collect_stats) {
    constexpr const char* op = "linear_forward";
    const c10::DeviceType device = kernel_device(x, op, "x");
    check_tensor(x, op, "x", {at::kFloat}, device);
    check_tensor(w, op, "w", {at::kFloat}, device);
    TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 2, where(op, "x/w"),
                      "must be 2-D (tokens x in_features and out_features x in_features); they have ", x.dim(), " and ",
                      w.dim(), " dimensions");
    TORCH_CHECK_VALUE(w.size(1) == x.size(1), where(op, "w"), "has ", w.size(1), " columns but x has ", x.size(1),
                      " (in_features); pass W as out_features x in_features");
    if (bias) {
        check_tensor(*bias, op, "bias", {at::kFloat}, device);
        TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == w.size(0) && bias->is_contiguous(), where(op, "bias"),
                          "has shape ", bias->sizes(),
                          "; pass a contiguous float32 vector of out_features = ", w.size(0), " entries");
    }
    return with_linear_recipe(recipe, op, [&](auto t) {
        using LR = typename decltype(t)::type;
        const forward_args a{x,
                             w,
                             bias,
                             scale_amax<LR>(x_history, op, "x_history"),
                             scale_amax<LR>(w_history, op, "w_history"),
                             seed,
                             save_x_t,
                             save_w_t,
                             keep_operands,
                             collect_stats};
        return run_forward<LR>(a);
    });
}

std::vector<at::Tensor> linear_backward(const at::Tensor& dy, at::TensorList saved, c10::string_view recipe,
                                        const std::optional<at::Tensor>& g_history, int64_t seed,
                                        const std::optional<at::Tensor>& philox, bool need_dx, bool need_dw,
                                        bool need_db, bool keep_operands, bool collect_stats) {
    constexpr const char* op = "linear_backward";
    check_tensor(dy, op, "dy", {at::kFloat}, kernel_device(dy, op, "dy"));
    TORCH_CHECK_VALUE(dy.dim() == 2, where(op, "dy"), "has ", dy.dim(),
                      " dimensions; pass a 2-D tokens x out_features gradient");
    int64_t step = 0;
    if (philox) {
        int64_t offset = 0;
        std::tie(seed, offset) = philox_pair(*philox, op);
        TORCH_CHECK_VALUE(offset >= 0 && offset % 4 == 0, where(op, "philox"), "has offset ", offset,
                          "; backward s of a layer draws from offset 4 s (pass a multiple of 4)");
        step = offset / 4;
    }
    return with_linear_recipe(recipe, op, [&](auto t) {
        using LR = typename decltype(t)::type;
        const backward_args a{dy,           saved,   scale_amax<LR>(g_history, op, "g_history"),
                              seed,         step,    need_dx,
                              need_dw,      need_db, keep_operands,
                              collect_stats};
        return run_backward<LR>(a);
    });
}

}  // namespace
}  // namespace octet_torch::linear

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "linear_forward(Tensor x, Tensor w, Tensor? bias, str recipe, Tensor? x_history=None, Tensor? "
        "w_history=None, int seed=0, bool save_x_t=True, bool save_w_t=True, bool keep_operands=False, bool "
        "collect_stats=False) -> Tensor[]");
    m.def(
        "linear_backward(Tensor dy, Tensor[] saved, str recipe, Tensor? g_history=None, int seed=0, Tensor? "
        "philox=None, bool need_dx=True, bool need_dw=True, bool need_db=True, bool keep_operands=False, bool "
        "collect_stats=False) -> Tensor[]");
    m.def("linear_recipe_names() -> str[]");
    m.def(
        "linear_recipe_info(str recipe) -> (str x, str w, str g, bool delayed, bool stochastic_gradients, bool "
        "hadamard_wgrad, bool on_cuda)");
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("linear_recipe_names", &octet_torch::linear::linear_recipe_names_op);
    m.impl("linear_recipe_info", &octet_torch::linear::linear_recipe_info);
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("linear_forward", &octet_torch::linear::linear_forward);
    m.impl("linear_backward", &octet_torch::linear::linear_backward);
}

// Without CUDA kernels the same functions answer a CUDA tensor with an error that says so.
TORCH_LIBRARY_IMPL(octet, CUDA, m) {
    m.impl("linear_forward", &octet_torch::linear::linear_forward);
    m.impl("linear_backward", &octet_torch::linear::linear_backward);
}
