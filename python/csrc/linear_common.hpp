// linear_common.hpp: the quantized linear layer (octet/nn/linear.hpp) as two torch ops, on buffers
// the ops allocate as tensors (linear_forward_buffers / linear_backward_buffers): what
// octet.torch.Float8Linear runs. linear_ops.cpp registers the ops and checks what needs no recipe;
// the shards linear_<recipe>.cpp, generated from registry.hpp's OCTET_TORCH_LINEAR_RECIPES,
// instantiate one linear recipe each, so that they compile in parallel.
//
//   octet::linear_forward(x, w, bias, recipe, x_history, w_history, seed, save_x_t, save_w_t,
//                         keep_operands, collect_stats) -> Tensor[]
//       [y, x_amax, w_amax, X^T copy (save_x_t), W^T copy (save_w_t),
//        X's and W's row-wise copies (keep_operands), stats float64 [4, 8] (collect_stats)]
//   octet::linear_backward(dy, saved, recipe, g_history, seed, philox, need_dx, need_dw, need_db,
//                          keep_operands, collect_stats) -> Tensor[]
//       saved: the X^T copy (when need_dw), then the W^T copy (when need_dx), as the forward returned them
//       [dx (need_dx), dw (need_dw), db (need_db), dy_amax, dY's row-wise copy (keep_operands and
//        need_dx), dY^T's copy (keep_operands and need_dw), stats float64 [2, 8] (collect_stats)]
// A copy is (codes, scales) plus tensor_scale for two-level recipes (NVFP4), as octet::quantize
// returns it; X^T's copy spans linear_wgrad_tokens(tokens) columns (tokens padded to 16 under the
// Hadamard rotation). Stats rows (quantize's 8 fields, zeros for a copy not made): forward X, X^T
// (the rotated X's under HadamardWgrad), W, W^T; backward dY, dY^T. The amaxes (0-d float32) are
// the inputs' own, for the caller's delayed-scaling history (dy_amax is 0 when dY was not quantized).
// Histories give tensor_amax as the quantize op's amax_history does; philox (int64 [seed, offset])
// gives the stochastic-rounding seed and the backward number offset / 4 (nn/linear.hpp draws
// backward s from offset 4 s); without it, seed and backward 0. X, W and dY are float32.
#pragma once

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "octet/nn/linear.hpp"
#include "octet_torch.hpp"
#ifdef OCTET_TORCH_CUDA
#include "linear_device.hpp"
#include "octet_torch_cuda.hpp"
#endif

namespace octet_torch::linear {

struct forward_args {
    const at::Tensor& x;
    const at::Tensor& w;
    const std::optional<at::Tensor>& bias;
    float x_scale_amax, w_scale_amax;
    int64_t seed;
    bool save_x_t, save_w_t, keep_operands, collect_stats;
};

struct backward_args {
    const at::Tensor& dy;
    at::TensorList saved;
    float g_scale_amax;
    int64_t seed, step;
    bool need_dx, need_dw, need_db, keep_operands, collect_stats;
};

/// The linear recipe names Python passes (octet::linear_recipes::<name>), in registry.hpp's order.
#define OCTET_TORCH_LINEAR_NAME(name, on_cuda) #name,
inline constexpr std::string_view linear_recipe_names[] = {OCTET_TORCH_LINEAR_RECIPES(OCTET_TORCH_LINEAR_NAME)};
#undef OCTET_TORCH_LINEAR_NAME

/// Whether the linear recipe's ops have CUDA kernels (registry.hpp's on_cuda).
template <class LR>
inline constexpr bool linear_on_cuda = false;
#define OCTET_TORCH_LINEAR_ON_CUDA(name, on_cuda) \
    template <>                                   \
    inline constexpr bool linear_on_cuda<octet::linear_recipes::name> = on_cuda;
OCTET_TORCH_LINEAR_RECIPES(OCTET_TORCH_LINEAR_ON_CUDA)
#undef OCTET_TORCH_LINEAR_ON_CUDA

template <class LR>
std::vector<at::Tensor> run_forward(const forward_args& a);
template <class LR>
std::vector<at::Tensor> run_backward(const backward_args& a);

template <class R>
void push_copy(std::vector<at::Tensor>& out, const copy_tensors<R>& c) {
    out.push_back(c.codes);
    out.push_back(c.scales);
    if constexpr (R::two_level) out.push_back(c.tensor_scale);
}

inline at::Tensor scalar(float v, const at::TensorOptions& o) {
    at::Tensor t = at::empty({}, o.dtype(at::kFloat));
    *t.data_ptr<float>() = v;
    return t;
}

/// The device's tensor_amax of a delayed-scaling operand (null: current scaling), staged on the
/// stream by a fill kernel into `keep` (no synchronization).
inline const float* device_scale_amax(float amax, const at::TensorOptions& o, at::Tensor& keep) {
    if (amax < 0) return nullptr;
    keep = at::full({1}, amax, o.dtype(at::kFloat));
    return keep.data_ptr<float>();
}

/// A linear recipe without CUDA kernels, on CUDA: NVFP4's FP4 GEMMs need cuBLASLt, which the ops do
/// not lend (checked before any buffer is allocated).
template <class LR>
void require_linear_on_cuda(const char* op) {
#ifdef OCTET_TORCH_CUDA
    if constexpr (!linear_on_cuda<LR>) {
        std::string name, on_cuda;
#define OCTET_TORCH_LINEAR_NAMES(n, on_cuda_)                    \
    if (std::is_same_v<LR, octet::linear_recipes::n>) name = #n; \
    if (on_cuda_) on_cuda += std::string(on_cuda.empty() ? "" : ", ") + #n;
        OCTET_TORCH_LINEAR_RECIPES(OCTET_TORCH_LINEAR_NAMES)
#undef OCTET_TORCH_LINEAR_NAMES
        TORCH_CHECK_VALUE(false, where(op, "recipe"), "is ", name,
                          ", a recipe without CUDA kernels in octet's torch ops (nvfp4: its FP4 GEMMs run through "
                          "cuBLASLt in octet, which the ops do not use); run this layer on the CPU, or pick one of ",
                          on_cuda, " on CUDA");
    }
#else
    TORCH_CHECK_VALUE(false, where(op, "x"), "is a CUDA tensor in a build without CUDA kernels (unreachable)");
#endif
}

/// The forward on torch's current stream: statistics and amaxes from the device's
/// device_linear_forward_stats by views and copies (no synchronization).
template <class LR>
void run_forward_cuda(const forward_args& a, octet::matrix_ref<const float> X, octet::matrix_ref<const float> W,
                      octet::span<const float> bias, octet::matrix_ref<float> y,
                      const octet::linear_forward_buffers<LR>& buf, at::Tensor& x_amax, at::Tensor& w_amax,
                      at::Tensor& stats) {
#ifdef OCTET_TORCH_CUDA
    if constexpr (linear_on_cuda<LR>) {
        using S = octet::device_linear_forward_stats;
        const c10::cuda::CUDAGuard guard(a.x.device());
        const at::TensorOptions o = a.x.options();
        const at::Tensor raw = at::empty({static_cast<int64_t>(sizeof(S))}, o.dtype(at::kByte));
        at::Tensor keep_x, keep_w;
        octet::device_linear_step_options so;
        so.x_scale_amax = device_scale_amax(a.x_scale_amax, o, keep_x);
        so.w_scale_amax = device_scale_amax(a.w_scale_amax, o, keep_w);
        so.seed = static_cast<std::uint64_t>(a.seed);
        so.collect_stats = a.collect_stats;
        guarded([&] {
            device::linear_forward<LR>(device_executor(a.x), X, W, bias, y, buf, so, static_cast<S*>(raw.data_ptr()));
        });
        x_amax = float_from_device(raw, offsetof(S, x_amax));
        w_amax = float_from_device(raw, offsetof(S, w_amax));
        if (a.collect_stats) {  // rows x, w, x_hadamard, each {row-wise, column-wise}
            const at::Tensor s = stats_from_device(raw, offsetof(S, x), 6);
            stats = at::cat({s.narrow(0, 0, 1), s.narrow(0, LR::hadamard_wgrad ? 5 : 1, 1), s.narrow(0, 2, 2)});
        }
    }
#else
    (void)a, (void)X, (void)W, (void)bias, (void)y, (void)buf, (void)x_amax, (void)w_amax, (void)stats;
#endif
}

/// The backward on torch's current stream (as run_forward_cuda).
template <class LR>
void run_backward_cuda(const backward_args& a, octet::matrix_ref<const float> dY, octet::matrix_ref<float> dx,
                       octet::matrix_ref<float> dw, octet::span<float> db,
                       const octet::linear_backward_buffers<LR>& buf, at::Tensor& dy_amax, at::Tensor& stats) {
#ifdef OCTET_TORCH_CUDA
    if constexpr (linear_on_cuda<LR>) {
        using S = octet::device_linear_backward_stats;
        const c10::cuda::CUDAGuard guard(a.dy.device());
        const at::TensorOptions o = a.dy.options();
        const at::Tensor raw = at::empty({static_cast<int64_t>(sizeof(S))}, o.dtype(at::kByte));
        at::Tensor keep_g;
        octet::device_linear_step_options so;
        so.g_scale_amax = device_scale_amax(a.g_scale_amax, o, keep_g);
        so.seed = static_cast<std::uint64_t>(a.seed);
        so.step = static_cast<std::uint64_t>(a.step);
        so.collect_stats = a.collect_stats;
        guarded([&] {
            device::linear_backward<LR>(device_executor(a.dy), dY, dx, dw, db, buf, so,
                                        static_cast<S*>(raw.data_ptr()));
        });
        dy_amax = float_from_device(raw, offsetof(S, dy_amax));
        if (a.collect_stats) {  // rows dy, dy_hadamard, each {row-wise, column-wise}
            const at::Tensor s = stats_from_device(raw, offsetof(S, dy), 4);
            stats = at::cat({s.narrow(0, 0, 1), s.narrow(0, LR::hadamard_wgrad ? 3 : 1, 1)});
        }
    }
#else
    (void)a, (void)dY, (void)dx, (void)dw, (void)db, (void)buf, (void)dy_amax, (void)stats;
#endif
}

template <class LR>
std::vector<at::Tensor> run_forward(const forward_args& a) {
    constexpr const char* op = "linear_forward";
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    if (a.x.is_cuda()) require_linear_on_cuda<LR>(op);
    const auto X = as_matrix<const float>(a.x, op, "x");
    const auto W = as_matrix<const float>(a.w, op, "w");
    const std::size_t T = X.rows, I = X.cols, O = W.rows, P = octet::linear_wgrad_tokens<LR>(T);
    const at::TensorOptions o = a.x.options();
    copy_tensors<XR> xq(T, I, o);
    copy_tensors<WR> wq(O, I, o);
    std::optional<copy_tensors<XR>> x_t;
    std::optional<copy_tensors<WR>> w_t;
    if (a.save_x_t) x_t.emplace(I, P, o);
    if (a.save_w_t) w_t.emplace(I, O, o);
    at::Tensor rotated;
    octet::linear_forward_buffers<LR> buf{xq.ref(),
                                          wq.ref(),
                                          x_t ? x_t->ref() : octet::quantized_ref<XR>{},
                                          w_t ? w_t->ref() : octet::quantized_ref<WR>{},
                                          {}};
    if (LR::hadamard_wgrad && a.save_x_t) {
        rotated = at::empty({static_cast<int64_t>(P * I)}, o);
        buf.rotated = octet::span<float>(rotated.data_ptr<float>(), P * I);
    }
    at::Tensor y = at::empty({static_cast<int64_t>(T), static_cast<int64_t>(O)}, o);
    octet::span<const float> bias;
    if (a.bias) bias = octet::span<const float>(a.bias->data_ptr<float>(), static_cast<std::size_t>(a.bias->numel()));
    at::Tensor x_amax, w_amax, stats;
    if (a.x.is_cuda()) {
        run_forward_cuda<LR>(a, X, W, bias, as_matrix<float>(y, op, "y"), buf, x_amax, w_amax, stats);
    } else {
        octet::linear_step_options so;
        so.x_scale_amax = a.x_scale_amax;
        so.w_scale_amax = a.w_scale_amax;
        so.seed = static_cast<std::uint64_t>(a.seed);
        so.collect_stats = a.collect_stats;
        octet::linear_stats st;
        guarded([&] { octet::linear_forward<LR>(host(), X, W, bias, as_matrix<float>(y, op, "y"), buf, so, st); });
        x_amax = scalar(st.x.amax, o);
        w_amax = scalar(st.w.amax, o);
        if (a.collect_stats) {
            stats = at::zeros({4, 8}, o.dtype(at::kDouble));
            double* s = stats.data_ptr<double>();
            put_quant_stats(s, st.x.rowwise);
            put_quant_stats(s + 8, LR::hadamard_wgrad ? st.x_hadamard.columnwise : st.x.columnwise);
            put_quant_stats(s + 16, st.w.rowwise);
            put_quant_stats(s + 24, st.w.columnwise);
        }
    }

    std::vector<at::Tensor> out{y, x_amax, w_amax};
    if (x_t) push_copy(out, *x_t);
    if (w_t) push_copy(out, *w_t);
    if (a.keep_operands) {
        push_copy(out, xq);
        push_copy(out, wq);
    }
    if (a.collect_stats) out.push_back(stats);
    return out;
}

/// The copy at saved[pos...] (codes, scales, and tensor_scale for two-level recipes); moves `pos` on.
template <class R>
octet::quantized_cref<R> saved_copy(at::TensorList saved, std::size_t& pos, int64_t cols, const char* arg,
                                    c10::DeviceType device) {
    constexpr std::size_t n = R::two_level ? 3 : 2;
    TORCH_CHECK_VALUE(saved.size() >= pos + n, where("linear_backward", "saved"), "holds ", saved.size(),
                      " tensors; it needs ", arg, " as ", n, " tensors (codes, scales",
                      R::two_level ? ", tensor_scale" : "", ") at position ", pos,
                      ": pass the copies linear_forward returned (X^T's when need_dw, then W^T's when need_dx)");
    const at::Tensor ts = R::two_level ? saved[pos + 2] : at::Tensor();
    const auto q = as_quantized<R>(saved[pos], saved[pos + 1], ts, cols, "linear_backward", arg, device);
    pos += n;
    return q;
}

template <class LR>
std::vector<at::Tensor> run_backward(const backward_args& a) {
    constexpr const char* op = "linear_backward";
    using XR = typename LR::x_recipe;
    using WR = typename LR::w_recipe;
    using GR = typename LR::g_quantize_recipe;
    if (a.dy.is_cuda()) require_linear_on_cuda<LR>(op);
    const auto dY = as_matrix<const float>(a.dy, op, "dy");
    const std::size_t T = dY.rows, O = dY.cols, P = octet::linear_wgrad_tokens<LR>(T);
    const at::TensorOptions o = a.dy.options();
    octet::linear_backward_buffers<LR> buf;
    std::size_t pos = 0;
    const c10::DeviceType device = a.dy.device().type();
    if (a.need_dw) buf.x_t = saved_copy<XR>(a.saved, pos, static_cast<int64_t>(P), "x_t", device);
    if (a.need_dx) buf.w_t = saved_copy<WR>(a.saved, pos, static_cast<int64_t>(O), "w_t", device);
    TORCH_CHECK_VALUE(pos == a.saved.size(), where(op, "saved"), "holds ", a.saved.size(),
                      " tensors; need_dw = ", a.need_dw, " and need_dx = ", a.need_dx, " read ", pos);
    TORCH_CHECK_VALUE(!(a.need_dx && a.need_dw) || buf.x_t.rows() == buf.w_t.rows(), where(op, "saved"),
                      "holds an X^T copy of ", buf.x_t.rows(), " rows and a W^T copy of ", buf.w_t.rows(),
                      "; both have in_features rows (pass one forward's copies)");
    const std::size_t I = a.need_dx ? buf.w_t.rows() : buf.x_t.rows();
    std::optional<copy_tensors<GR>> dy, dy_t;
    if (a.need_dx) dy.emplace(T, O, o);
    if (a.need_dw) dy_t.emplace(O, P, o);
    if (dy) buf.dy = dy->ref();
    if (dy_t) buf.dy_t = dy_t->ref();
    at::Tensor rotated;
    if (LR::hadamard_wgrad && a.need_dw) {
        rotated = at::empty({static_cast<int64_t>(P * O)}, o);
        buf.rotated = octet::span<float>(rotated.data_ptr<float>(), P * O);
    }
    auto matrix = [&](bool want, std::size_t rows, std::size_t cols) {
        return want ? at::empty({static_cast<int64_t>(rows), static_cast<int64_t>(cols)}, o) : at::Tensor();
    };
    at::Tensor dx = matrix(a.need_dx, T, I), dw = matrix(a.need_dw, O, I);
    at::Tensor db = a.need_db ? at::empty({static_cast<int64_t>(O)}, o) : at::Tensor();
    const auto dx_m = a.need_dx ? as_matrix<float>(dx, op, "dx") : octet::matrix_ref<float>{};
    const auto dw_m = a.need_dw ? as_matrix<float>(dw, op, "dw") : octet::matrix_ref<float>{};
    const auto db_s = a.need_db ? octet::span<float>(db.data_ptr<float>(), O) : octet::span<float>{};
    at::Tensor dy_amax, stats;
    if (a.dy.is_cuda()) {
        run_backward_cuda<LR>(a, dY, dx_m, dw_m, db_s, buf, dy_amax, stats);
    } else {
        octet::linear_step_options so;
        so.g_scale_amax = a.g_scale_amax;
        so.seed = static_cast<std::uint64_t>(a.seed);
        so.step = static_cast<std::uint64_t>(a.step);
        so.collect_stats = a.collect_stats;
        octet::linear_stats st;
        guarded([&] { octet::linear_backward<LR>(host(), dY, dx_m, dw_m, db_s, buf, so, st); });
        dy_amax = scalar(st.dy.amax, o);
        if (a.collect_stats) {
            stats = at::zeros({2, 8}, o.dtype(at::kDouble));
            put_quant_stats(stats.data_ptr<double>(), st.dy.rowwise);
            put_quant_stats(stats.data_ptr<double>() + 8,
                            LR::hadamard_wgrad ? st.dy_hadamard.columnwise : st.dy.columnwise);
        }
    }

    std::vector<at::Tensor> out;
    for (const at::Tensor* t : {&dx, &dw, &db})
        if (t->defined()) out.push_back(*t);
    out.push_back(dy_amax);
    if (a.keep_operands) {
        if (dy) push_copy(out, *dy);
        if (dy_t) push_copy(out, *dy_t);
    }
    if (a.collect_stats) out.push_back(stats);
    return out;
}

}  // namespace octet_torch::linear

/// The instantiations of octet::linear_recipes::name: declared extern where extern_ is `extern`
/// (linear_ops.cpp), defined where it is empty.
#define OCTET_TORCH_LINEAR_INSTANCES(extern_, name)                                                          \
    extern_ template std::vector<at::Tensor> octet_torch::linear::run_forward<octet::linear_recipes::name>(  \
        const octet_torch::linear::forward_args&);                                                           \
    extern_ template std::vector<at::Tensor> octet_torch::linear::run_backward<octet::linear_recipes::name>( \
        const octet_torch::linear::backward_args&);

/// The shard X(name, on_cuda) of OCTET_TORCH_LINEAR_RECIPES (the generated linear_<name>.cpp).
#define OCTET_TORCH_LINEAR_SHARD(name, on_cuda) OCTET_TORCH_LINEAR_INSTANCES(, name)
#define OCTET_TORCH_LINEAR_EXTERN_SHARD(name, on_cuda) OCTET_TORCH_LINEAR_INSTANCES(extern, name)
