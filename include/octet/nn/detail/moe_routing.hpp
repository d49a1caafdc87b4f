// octet/nn/detail/moe_routing.hpp: the implementation of octet/nn/moe_routing.hpp (included at its
// end): the router's rows, the counting sort of the dispatch plan, and the host loops of permute and
// combine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "octet/core/check.hpp"
#include "octet/nn/moe_routing.hpp"

namespace octet {
namespace detail {

inline constexpr std::size_t router_block_tokens = 256;

/// One token's softmax: max and sum of exp(l - max), or bad (a NaN, a +Inf, or every logit -Inf).
struct router_row {
    const float* l = nullptr;
    std::size_t experts = 0;
    float max = 0.0f, sum = 0.0f;
    bool bad = false;

    router_row(const float* logits, std::size_t stride, std::size_t e_count, float* row_copy)
        : l(logits), experts(e_count) {
        // logits come in either storage order; a row is read once into row_copy when strided
        if (stride != 1) {
            for (std::size_t e = 0; e < experts; ++e) row_copy[e] = logits[e * stride];
            l = row_copy;
        }
        max = -std::numeric_limits<float>::infinity();
        for (std::size_t e = 0; e < experts; ++e) {
            if (std::isnan(l[e]) || l[e] == std::numeric_limits<float>::infinity()) bad = true;
            max = std::max(max, l[e]);
        }
        if (max == -std::numeric_limits<float>::infinity()) bad = true;
        if (bad) return;
        for (std::size_t e = 0; e < experts; ++e) sum += std::exp(l[e] - max);
    }
    float p(std::size_t e) const { return bad ? std::numeric_limits<float>::quiet_NaN() : std::exp(l[e] - max) / sum; }
};

/// Selection order: a larger score first, NaN below every number, ties to the lower index.
inline bool selected_before(float sa, std::size_t a, float sb, std::size_t b) {
    const bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;
    if (!na && sa != sb) return sa > sb;
    return a < b;
}

/// The router's scratch, described once for the query and the call.
inline void carve_router_scratch(scratch_carver& c, std::size_t tokens, std::size_t experts, std::size_t chunks,
                                 double** partial, std::size_t** bad, float** rows) {
    const std::size_t blocks = (tokens + router_block_tokens - 1) / router_block_tokens;
    *partial = c.take<double>(blocks * experts);
    *bad = c.take<std::size_t>(blocks);
    *rows = c.take<float>(chunks * experts);
}

inline constexpr std::size_t router_backward_grain = 64;

/// route_backward's scratch, per chunk: a token's gradient in double and a copy of a strided logits row.
inline void carve_router_backward_scratch(scratch_carver& c, std::size_t chunks, std::size_t experts, double** grads,
                                          float** rows) {
    *grads = c.take<double>(chunks * experts);
    *rows = c.take<float>(chunks * experts);
}

inline void check_router_shapes(const char* fn, matrix_ref<const float> logits, const router_options& opt) {
    const std::size_t E = logits.cols;
    OCTET_REQUIRE(E >= 1 || logits.rows == 0, fn, "logits", "has no experts (0 columns); pass tokens x experts");
    OCTET_REQUIRE(opt.k >= 1 && opt.k <= std::max<std::size_t>(E, 1), fn, "opt.k",
                  message("is ", opt.k, " with ", E, " experts; choose 1 <= k <= experts"));
    OCTET_REQUIRE(E <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), fn, "logits",
                  message("has ", E, " experts; indices are int32"));
    OCTET_REQUIRE(opt.selection_bias.empty() || opt.selection_bias.size() == E, fn, "opt.selection_bias",
                  message("has ", opt.selection_bias.size(), " entries; pass one per expert (", E, ") or none"));
}

template <class T>
float load_float(const T& v) {
    if constexpr (std::is_same_v<std::remove_cv_t<T>, float>)
        return v;
    else
        return to_float(v);
}
template <class T>
T store_float(float v) {
    if constexpr (std::is_same_v<T, float>)
        return v;
    else
        return to_bf16(v);
}
template <class T>
inline constexpr bool is_float_or_bf16_v =
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, bf16>;

inline void check_plan(const char* fn, const dispatch_plan_ref& plan) {
    OCTET_REQUIRE(
        plan.group_sizes.size() == plan.experts && plan.group_offsets.size() == plan.experts + 1 &&
            plan.order.size() == plan.assignments() && plan.row_of.size() == plan.assignments(),
        fn, "plan",
        message("has buffers of ", plan.group_sizes.size(), ", ", plan.group_offsets.size(), ", ", plan.order.size(),
                " and ", plan.row_of.size(), " entries for ", plan.tokens, " tokens x ", plan.k, " slots and ",
                plan.experts, " experts; they must be experts, experts + 1, tokens k and tokens k (dispatch_plan)"));
}

}  // namespace detail

// ---- router -----------------------------------------------------------------------------------------

inline std::size_t route_scratch_bytes(std::size_t tokens, std::size_t experts) {
    detail::scratch_carver c;
    double* partial;
    std::size_t* bad;
    float* rows;
    // one strided-row copy per chunk; at most hardware threads chunks, bounded by the blocks
    const std::size_t blocks = (tokens + detail::router_block_tokens - 1) / detail::router_block_tokens;
    detail::carve_router_scratch(c, tokens, experts, blocks, &partial, &bad, &rows);
    return c.bytes();
}

inline router_result route(const host_executor& ex, matrix_ref<const float> logits, const router_options& opt,
                           matrix_ref<std::int32_t> indices, matrix_ref<float> weights, span<std::size_t> counts) {
    constexpr const char* fn = "octet::route";
    detail::check_router_shapes(fn, logits, opt);
    const std::size_t T = logits.rows, E = logits.cols, k = opt.k;
    OCTET_REQUIRE(indices.rows == T && indices.cols == k, fn, "indices",
                  detail::message("is ", indices.rows, " x ", indices.cols, "; it must be tokens x k = ", T, " x ", k));
    OCTET_REQUIRE(weights.rows == T && weights.cols == k, fn, "weights",
                  detail::message("is ", weights.rows, " x ", weights.cols, "; it must be tokens x k = ", T, " x ", k));
    OCTET_REQUIRE(counts.size() == E, fn, "counts",
                  detail::message("has ", counts.size(), " entries; pass one per expert (", E, ")"));
    router_result result;
    std::fill(counts.begin(), counts.end(), std::size_t{0});
    if (T == 0) return result;

    const std::size_t blocks = (T + detail::router_block_tokens - 1) / detail::router_block_tokens;
    detail::host_scratch scratch(ex, route_scratch_bytes(T, E), fn);
    detail::scratch_carver carver = scratch.carver();
    double* partial;
    std::size_t* bad_tokens;
    float* row_copies;
    detail::carve_router_scratch(carver, T, E, blocks, &partial, &bad_tokens, &row_copies);
    const std::size_t stride = logits.order == storage_order::row_major ? 1 : logits.ld;
    const bool biased = !opt.selection_bias.empty();

    parallel_for_chunks(ex, blocks, 1, [&](std::size_t chunk, std::size_t b0, std::size_t b1) {
        float* row_copy = row_copies + chunk * E;
        for (std::size_t b = b0; b < b1; ++b) {
            double* P = partial + b * E;
            std::fill(P, P + E, 0.0);
            bad_tokens[b] = 0;
            const std::size_t t1 = std::min(T, (b + 1) * detail::router_block_tokens);
            for (std::size_t t = b * detail::router_block_tokens; t < t1; ++t) {
                const detail::router_row row(&logits(t, 0), stride, E, row_copy);
                bad_tokens[b] += row.bad;
                auto score = [&](std::size_t e) { return biased ? row.p(e) + opt.selection_bias[e] : row.l[e]; };
                // insertion into the k best so far (best first): O(E k), no scratch
                std::size_t n = 0;
                for (std::size_t e = 0; e < E; ++e) {
                    const float s = score(e);
                    if (n == k && !detail::selected_before(s, e, score(static_cast<std::size_t>(indices(t, k - 1))),
                                                           static_cast<std::size_t>(indices(t, k - 1))))
                        continue;
                    std::size_t pos = n < k ? n++ : k - 1;
                    while (pos > 0) {
                        const auto prev = static_cast<std::size_t>(indices(t, pos - 1));
                        if (!detail::selected_before(s, e, score(prev), prev)) break;
                        indices(t, pos) = indices(t, pos - 1);
                        --pos;
                    }
                    indices(t, pos) = static_cast<std::int32_t>(e);
                }
                // the weights, from the unbiased scores
                if (opt.gate == gate_mode::topk_softmax) {
                    float m = -std::numeric_limits<float>::infinity(), z = 0.0f;
                    for (std::size_t j = 0; j < k; ++j) m = std::max(m, row.l[indices(t, j)]);
                    for (std::size_t j = 0; j < k; ++j) z += std::exp(row.l[indices(t, j)] - m);
                    for (std::size_t j = 0; j < k; ++j)
                        weights(t, j) =
                            row.bad ? std::numeric_limits<float>::quiet_NaN() : std::exp(row.l[indices(t, j)] - m) / z;
                } else {
                    float z = 0.0f;
                    for (std::size_t j = 0; j < k; ++j) z += row.p(static_cast<std::size_t>(indices(t, j)));
                    for (std::size_t j = 0; j < k; ++j) {
                        const float p = row.p(static_cast<std::size_t>(indices(t, j)));
                        weights(t, j) = opt.gate == gate_mode::softmax_topk_renormalized ? p / z : p;
                    }
                }
                for (std::size_t e = 0; e < E; ++e) P[e] += row.p(e);
            }
        }
    });

    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < k; ++j) ++counts[static_cast<std::size_t>(indices(t, j))];
    for (std::size_t b = 0; b < blocks; ++b) result.nonfinite_tokens += bad_tokens[b];
    double aux = 0.0;
    for (std::size_t e = 0; e < E; ++e) {
        double P = 0.0;
        for (std::size_t b = 0; b < blocks; ++b) P += partial[b * E + e];
        aux += static_cast<double>(counts[e]) / static_cast<double>(T * k) * (P / static_cast<double>(T));
    }
    result.aux_loss = static_cast<double>(E) * aux;
    return result;
}

inline std::size_t route_backward_scratch_bytes(const host_executor& ex, std::size_t tokens, std::size_t experts) {
    detail::scratch_carver c;
    double* grads;
    float* rows;
    detail::carve_router_backward_scratch(c, detail::parallel_chunks(ex, tokens, detail::router_backward_grain),
                                          experts, &grads, &rows);
    return c.bytes();
}

inline void route_backward(const host_executor& ex, matrix_ref<const float> logits,
                           matrix_ref<const std::int32_t> indices, matrix_ref<const float> dweights,
                           const router_options& opt, matrix_ref<float> dlogits, float aux_loss_grad,
                           span<const std::size_t> counts) {
    constexpr const char* fn = "octet::route_backward";
    detail::check_router_shapes(fn, logits, opt);
    const std::size_t T = logits.rows, E = logits.cols, k = opt.k;
    OCTET_REQUIRE(indices.rows == T && indices.cols == k, fn, "indices",
                  detail::message("is ", indices.rows, " x ", indices.cols, "; it must be tokens x k = ", T, " x ", k,
                                  " (route's output for these logits)"));
    OCTET_REQUIRE(
        dweights.rows == T && dweights.cols == k, fn, "dweights",
        detail::message("is ", dweights.rows, " x ", dweights.cols, "; it must be tokens x k = ", T, " x ", k));
    OCTET_REQUIRE(
        dlogits.rows == T && dlogits.cols == E, fn, "dlogits",
        detail::message("is ", dlogits.rows, " x ", dlogits.cols, "; it must be logits' shape ", T, " x ", E));
    OCTET_REQUIRE(aux_loss_grad == 0.0f || counts.size() == E, fn, "counts",
                  detail::message("has ", counts.size(), " entries; the auxiliary loss's gradient needs route's ", E,
                                  " expert counts"));
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < k; ++j)
            OCTET_REQUIRE(indices(t, j) >= 0 && static_cast<std::size_t>(indices(t, j)) < E, fn, "indices",
                          detail::message("(", t, ", ", j, ") is ", indices(t, j), "; experts are 0 .. ", E - 1));
    if (T == 0) return;
    const std::size_t stride = logits.order == storage_order::row_major ? 1 : logits.ld;
    const std::size_t chunks = detail::parallel_chunks(ex, T, detail::router_backward_grain);
    double* grads;
    float* row_copies;
    detail::host_scratch scratch(ex, route_backward_scratch_bytes(ex, T, E), fn);
    detail::scratch_carver carver = scratch.carver();
    detail::carve_router_backward_scratch(carver, chunks, E, &grads, &row_copies);
    // f_e for the auxiliary loss's gradient, and its scale E / tokens
    const double aux_scale = static_cast<double>(aux_loss_grad) * static_cast<double>(E) / static_cast<double>(T);

    parallel_for_chunks(ex, T, detail::router_backward_grain, [&](std::size_t chunk, std::size_t t0, std::size_t t1) {
        double* dl = grads + chunk * E;
        float* row_copy = row_copies + chunk * E;
        for (std::size_t t = t0; t < t1; ++t) {
            const detail::router_row row(&logits(t, 0), stride, E, row_copy);
            std::fill(dl, dl + E, 0.0);
            if (opt.gate == gate_mode::topk_softmax) {
                // w = softmax of the selected logits: dl_{S_j} = w_j (g_j - sum_m g_m w_m)
                double m = -std::numeric_limits<double>::infinity(), z = 0.0, gw = 0.0;
                for (std::size_t j = 0; j < k; ++j) m = std::max<double>(m, row.l[indices(t, j)]);
                for (std::size_t j = 0; j < k; ++j) z += std::exp(row.l[indices(t, j)] - m);
                for (std::size_t j = 0; j < k; ++j) gw += dweights(t, j) * std::exp(row.l[indices(t, j)] - m) / z;
                for (std::size_t j = 0; j < k; ++j) {
                    const double w = std::exp(row.l[indices(t, j)] - m) / z;
                    dl[indices(t, j)] += w * (dweights(t, j) - gw);
                }
            } else {
                // dL/dp over the selected experts, then the softmax's backward dl_e = p_e (dp_e - sum_i dp_i p_i)
                double z = 0.0, gw = 0.0;
                for (std::size_t j = 0; j < k; ++j) z += row.p(static_cast<std::size_t>(indices(t, j)));
                const bool renorm = opt.gate == gate_mode::softmax_topk_renormalized;
                for (std::size_t j = 0; j < k; ++j)
                    gw += dweights(t, j) * row.p(static_cast<std::size_t>(indices(t, j))) / z;
                double dot = 0.0;
                for (std::size_t j = 0; j < k; ++j) {
                    const auto e = static_cast<std::size_t>(indices(t, j));
                    const double dp = renorm ? (dweights(t, j) - gw) / z : static_cast<double>(dweights(t, j));
                    dl[e] += dp;
                    dot += dp * row.p(e);
                }
                for (std::size_t e = 0; e < E; ++e) dl[e] = row.p(e) * (dl[e] - dot);
            }
            if (aux_loss_grad != 0.0f) {
                const double tk = static_cast<double>(T * k);
                double fp = 0.0;
                for (std::size_t e = 0; e < E; ++e) fp += static_cast<double>(counts[e]) / tk * row.p(e);
                for (std::size_t e = 0; e < E; ++e)
                    dl[e] += aux_scale * row.p(e) * (static_cast<double>(counts[e]) / tk - fp);
            }
            for (std::size_t e = 0; e < E; ++e)
                dlogits(t, e) = row.bad ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(dl[e]);
        }
    });
}

inline void update_expert_bias(span<float> bias, span<const std::size_t> counts, float gamma) {
    OCTET_REQUIRE(bias.size() == counts.size(), "octet::update_expert_bias", "counts",
                  detail::message("has ", counts.size(), " entries, bias ", bias.size(), "; pass one per expert"));
    if (bias.empty()) return;
    double total = 0.0;
    for (std::size_t c : counts) total += static_cast<double>(c);
    const double mean = total / static_cast<double>(counts.size());
    for (std::size_t e = 0; e < bias.size(); ++e) {
        const double load = static_cast<double>(counts[e]);
        bias[e] += load < mean ? gamma : (load > mean ? -gamma : 0.0f);
    }
}

// ---- dispatch plan ------------------------------------------------------------------------------------

inline dispatch_result plan_dispatch(matrix_ref<const std::int32_t> indices, const dispatch_options& opt,
                                     const dispatch_plan_ref& plan) {
    constexpr const char* fn = "octet::plan_dispatch";
    detail::check_plan(fn, plan);
    const std::size_t T = plan.tokens, k = plan.k, E = plan.experts;
    OCTET_REQUIRE(indices.rows == T && indices.cols == k, fn, "indices",
                  detail::message("is ", indices.rows, " x ", indices.cols, "; the plan is for ", T, " tokens x ", k,
                                  " slots (build the dispatch_plan with route's shape)"));
    OCTET_REQUIRE(T * k <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()), fn, "indices",
                  detail::message("holds ", T * k, " assignments; the plan's maps are int32 (split the batch)"));
    std::fill(plan.group_sizes.begin(), plan.group_sizes.end(), std::size_t{0});
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < k; ++j) {
            const std::int32_t e = indices(t, j);
            OCTET_REQUIRE(e >= 0 && static_cast<std::size_t>(e) < E, fn, "indices",
                          detail::message("(", t, ", ", j, ") is ", e, "; experts are 0 .. ", E == 0 ? 0 : E - 1,
                                          " (plan.experts = ", E, ")"));
            ++plan.group_sizes[static_cast<std::size_t>(e)];
        }
    for (std::size_t e = 0; e < E; ++e)
        OCTET_REQUIRE(opt.overflow != capacity_policy::error || plan.group_sizes[e] <= opt.capacity, fn, "opt.capacity",
                      detail::message("is ", opt.capacity, " but expert ", e, " receives ", plan.group_sizes[e],
                                      " assignments; raise the capacity or use capacity_policy::drop"));
    // offsets of the kept rows, then place each assignment in (token, slot) order: a stable counting sort
    plan.group_offsets[0] = 0;
    for (std::size_t e = 0; e < E; ++e) {
        plan.group_offsets[e + 1] = plan.group_offsets[e] + std::min(plan.group_sizes[e], opt.capacity);
        plan.group_sizes[e] = 0;  // now the rows placed so far
    }
    dispatch_result r;
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t j = 0; j < k; ++j) {
            const auto e = static_cast<std::size_t>(indices(t, j));
            const std::size_t a = t * k + j;
            if (plan.group_sizes[e] < opt.capacity) {
                const std::size_t row = plan.group_offsets[e] + plan.group_sizes[e]++;
                plan.order[row] = static_cast<std::int32_t>(a);
                plan.row_of[a] = static_cast<std::int32_t>(row);
            } else {
                plan.row_of[a] = -1;
                ++r.dropped;
            }
        }
    r.rows = plan.group_offsets[E];
    std::fill(plan.order.begin() + r.rows, plan.order.end(), -1);
    return r;
}

// ---- permute ------------------------------------------------------------------------------------------

template <class T, class U>
void permute_rows(const host_executor& ex, matrix_ref<T> x, const dispatch_plan_ref& plan, matrix_ref<U> out) {
    static_assert(detail::is_float_or_bf16_v<T> && detail::is_float_or_bf16_v<U>,
                  "octet::permute_rows: x and out hold float or octet::bf16");
    constexpr const char* fn = "octet::permute_rows";
    detail::check_plan(fn, plan);
    OCTET_REQUIRE(x.rows == plan.tokens, fn, "x",
                  detail::message("has ", x.rows, " rows; the plan routes ", plan.tokens, " tokens"));
    OCTET_REQUIRE(out.rows == plan.rows() && out.cols == x.cols, fn, "out",
                  detail::message("is ", out.rows, " x ", out.cols, "; it must be plan.rows() x d = ", plan.rows(),
                                  " x ", x.cols));
    parallel_for(ex, plan.rows(), 64, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            const std::size_t t = plan.token_of_row(r);
            for (std::size_t c = 0; c < x.cols; ++c) {
                if constexpr (std::is_same_v<std::remove_cv_t<T>, U>)
                    out(r, c) = x(t, c);
                else
                    out(r, c) = detail::store_float<U>(detail::load_float(x(t, c)));
            }
        }
    });
}

template <class Recipe>
permute_bytes permute_traffic(std::size_t rows, std::size_t cols) {
    permute_bytes b;
    if (rows == 0 || cols == 0) return b;
    const quant_layout l = quant_layout_of<Recipe>::make(1, cols);
    b.codes = rows * l.row_bytes;
    b.scales = Recipe::is_per_tensor ? 0 : rows * l.scale_cols * Recipe::scale_bytes;
    b.bf16 = rows * cols * sizeof(bf16);
    return b;
}

template <class Recipe, class Byte>
permute_bytes permute_quantized(const host_executor& ex, quantized_ref<Recipe, Byte> x, const dispatch_plan_ref& plan,
                                grouped_quantized_ref<Recipe> out) {
    constexpr const char* fn = "octet::permute_quantized";
    using G = typename Recipe::granularity;
    constexpr bool row_local = G::rows == 1 || Recipe::is_per_tensor;
    OCTET_REQUIRE(row_local, fn, "x",
                  detail::message("is quantized with blocks that span rows (", recipe_description<Recipe>(),
                                  "): a block would mix tokens routed to different experts. Quantize the activations "
                                  "with a row-local recipe (per_row, block<1, C> such as 1x128 or MXFP8) or per "
                                  "tensor, or permute the float rows (permute_rows) and grouped_quantize them"));
    detail::check_plan(fn, plan);
    OCTET_REQUIRE(!x.absent() && x.data != nullptr && x.scales != nullptr, fn, "x",
                  "is absent or has a null data or scales pointer; pass X's quantized copy (quantize<Recipe>)");
    OCTET_REQUIRE(!Recipe::two_level || x.tensor_scale != nullptr, fn, "x",
                  "is a two-level (NVFP4) copy without its tensor scale; pass quantized_tensor::cref()");
    OCTET_REQUIRE(x.rows() == plan.tokens, fn, "x",
                  detail::message("has ", x.rows(), " rows; the plan routes ", plan.tokens, " tokens"));
    const std::size_t d = x.cols();
    // out's groups are laid out for plan.group_sizes x d (checked here without building the shapes:
    // permute allocates nothing)
    OCTET_REQUIRE(out.layout != nullptr && out.groups() == plan.experts, fn, "out",
                  detail::message("has ", out.groups(), " groups for ", plan.experts,
                                  " experts; lay it out with grouped_rows(plan.group_sizes, d)"));
    for (std::size_t g = 0; g < plan.experts; ++g) {
        const quant_layout& q = out.layout->groups[g];
        OCTET_REQUIRE(q.rows == plan.group_sizes[g] && (q.cols == d || q.rows == 0), fn, "out",
                      detail::message("group ", g, " is ", q.rows, " x ", q.cols, " but must be ", plan.group_sizes[g],
                                      " x ", d, "; lay it out with grouped_rows(plan.group_sizes, d)"));
    }
    if (plan.rows() == 0 || d == 0) return {};
    OCTET_REQUIRE(out.data != nullptr && out.scales != nullptr, fn, "out",
                  "has a null data or scales pointer; pass a grouped_quantized_tensor's ref()");
    OCTET_REQUIRE(!Recipe::two_level || out.tensor_scales != nullptr, fn, "out",
                  "is a two-level (NVFP4) copy without tensor scales; point tensor_scales at one float per group");
    const grouped_layout& L = *out.layout;
    if (Recipe::two_level)
        for (std::size_t g = 0; g < L.size(); ++g) out.tensor_scales[g] = *x.tensor_scale;

    constexpr std::size_t SB = Recipe::scale_bytes;
    using Q = quant_layout_of<Recipe>;
    const std::size_t code_bytes =
        std::min(x.layout.row_bytes, (d + Q::group_codes - 1) / Q::group_codes * Q::group_bytes);  // the row's codes
    parallel_for(ex, plan.rows(), 64, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t r = r0; r < r1; ++r) {
            const std::size_t g =
                static_cast<std::size_t>(std::upper_bound(plan.group_offsets.begin(), plan.group_offsets.end(), r) -
                                         plan.group_offsets.begin() - 1);
            const std::size_t i = r - plan.group_offsets[g], t = plan.token_of_row(r);
            const quant_layout& q = L.groups[g];
            std::uint8_t* dst = out.data + L.data_offset[g] + i * q.row_bytes;
            std::memcpy(dst, x.data + t * x.layout.row_bytes, code_bytes);
            std::memset(dst + code_bytes, 0, q.row_bytes - code_bytes);
            std::uint8_t* scales = out.scales + L.scale_offset[g];
            if constexpr (Recipe::is_per_tensor) {
                if (i == 0) std::memcpy(scales, x.scales, SB);
            } else if constexpr (G::rows == 1) {
                for (std::size_t bj = 0; bj < q.scale_cols; ++bj)
                    std::memcpy(scales + (bj * q.scale_ld + i) * SB, x.scales + (bj * x.layout.scale_ld + t) * SB, SB);
                if (i + 1 == q.rows)  // the group's last row also zeroes the padding of its scale columns
                    for (std::size_t bj = 0; bj < q.scale_cols; ++bj)
                        std::memset(scales + (bj * q.scale_ld + q.scale_rows) * SB, 0,
                                    (q.scale_ld - q.scale_rows) * SB);
            }
        }
    });
    return permute_traffic<Recipe>(plan.rows(), d);
}

// ---- combine ------------------------------------------------------------------------------------------

namespace detail {
template <class Y>
void check_combine(const char* fn, matrix_ref<Y> y, matrix_ref<const float> weights, const dispatch_plan_ref& plan,
                   std::size_t d) {
    check_plan(fn, plan);
    OCTET_REQUIRE(y.rows == plan.rows() && y.cols == d, fn, "y",
                  message("is ", y.rows, " x ", y.cols, "; it must be plan.rows() x d = ", plan.rows(), " x ", d,
                          " (the experts' outputs in expert order)"));
    OCTET_REQUIRE(weights.rows == plan.tokens && weights.cols == plan.k, fn, "weights",
                  message("is ", weights.rows, " x ", weights.cols, "; it must be tokens x k = ", plan.tokens, " x ",
                          plan.k, " (route's weights)"));
}
}  // namespace detail

template <class Y, class Out>
void combine(const host_executor& ex, matrix_ref<Y> y, matrix_ref<const float> weights, const dispatch_plan_ref& plan,
             matrix_ref<Out> out) {
    static_assert(detail::is_float_or_bf16_v<Y> && detail::is_float_or_bf16_v<Out>,
                  "octet::combine: y and out hold float or octet::bf16");
    constexpr const char* fn = "octet::combine";
    OCTET_REQUIRE(out.rows == plan.tokens, fn, "out",
                  detail::message("has ", out.rows, " rows; it must have one per token (", plan.tokens, ")"));
    detail::check_combine(fn, y, weights, plan, out.cols);
    const std::size_t k = plan.k;
    parallel_for(ex, plan.tokens, 16, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t)
            for (std::size_t c = 0; c < out.cols; ++c) {
                float acc = 0.0f;
                for (std::size_t j = 0; j < k; ++j) {
                    const std::int32_t r = plan.row_of[t * k + j];
                    if (r >= 0) acc += weights(t, j) * detail::load_float(y(static_cast<std::size_t>(r), c));
                }
                out(t, c) = detail::store_float<Out>(acc);
            }
    });
}

template <class G, class Y, class DY>
void combine_backward(const host_executor& ex, matrix_ref<G> dout, matrix_ref<Y> y, matrix_ref<const float> weights,
                      const dispatch_plan_ref& plan, matrix_ref<DY> dy, matrix_ref<float> dweights) {
    static_assert(detail::is_float_or_bf16_v<G> && detail::is_float_or_bf16_v<Y> && detail::is_float_or_bf16_v<DY>,
                  "octet::combine_backward: dout, y and dy hold float or octet::bf16");
    constexpr const char* fn = "octet::combine_backward";
    OCTET_REQUIRE(dout.rows == plan.tokens, fn, "dout",
                  detail::message("has ", dout.rows, " rows; it must have one per token (", plan.tokens, ")"));
    detail::check_combine(fn, y, weights, plan, dout.cols);
    OCTET_REQUIRE(dy.rows == y.rows && dy.cols == y.cols, fn, "dy",
                  detail::message("is ", dy.rows, " x ", dy.cols, "; it must be y's shape ", y.rows, " x ", y.cols));
    OCTET_REQUIRE(dweights.rows == plan.tokens && dweights.cols == plan.k, fn, "dweights",
                  detail::message("is ", dweights.rows, " x ", dweights.cols, "; it must be tokens x k = ", plan.tokens,
                                  " x ", plan.k));
    const std::size_t k = plan.k, d = dout.cols;
    parallel_for(ex, plan.tokens, 16, [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t)
            for (std::size_t j = 0; j < k; ++j) {
                const std::int32_t ri = plan.row_of[t * k + j];
                if (ri < 0) {
                    dweights(t, j) = 0.0f;
                    continue;
                }
                const auto r = static_cast<std::size_t>(ri);
                const float w = weights(t, j);
                double dot = 0.0;
                for (std::size_t c = 0; c < d; ++c) {
                    const float g = detail::load_float(dout(t, c));
                    dy(r, c) = detail::store_float<DY>(w * g);
                    dot += static_cast<double>(g) * detail::load_float(y(r, c));
                }
                dweights(t, j) = static_cast<float>(dot);
            }
    });
}

}  // namespace octet
