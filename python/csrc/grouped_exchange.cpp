// The expert-parallel FP8 token exchange of octet/nn/moe_exchange.hpp run over in-process ranks
// (octet/comm/in_process.hpp: one thread per rank), as the reference that octet.torch's
// torch.distributed exchange (python/octet/torch/moe.py) must match bit for bit:
//
//   octet::moe_exchange_in_process(x[], indices[], weights[], w, experts, x_recipe, w_recipe, combine_wire)
//       -> Tensor[]
//
// x[r]: rank r's tokens (T_r x d, float32), indices[r] / weights[r]: its router's top-k choice
// (T_r x k, int64 or int32 in [0, experts)) and gates (T_r x k, float32); w: every expert's weight
// (experts x N x d, float32; rank r owns experts [r L, (r + 1) L), L = experts / P). Each rank
// quantizes its X once (x_recipe, row-local: blockwise_1x128 or mxfp8_e4m3), plans and exchanges the
// counts (moe_dispatch_plan_host), sends its FP8 rows to the owners (moe_dispatch_host), runs its
// experts' grouped GEMM on what it received (grouped_scaled_gemm, its experts' weights quantized with
// w_recipe, float results) and sends the results back for the weighted sum (moe_combine_host;
// combine_wire "bf16", "e4m3_1x128" or "f32": moe_combine_wire's). Returns, per rank r, six tensors:
//   [r*6 + 0] the received grouped copy's data block (uint8, make_grouped_layout of
//             grouped_rows(expert_rows, d), padding included), [r*6 + 1] its scale block (uint8),
//   [r*6 + 2] expert_rows (int64 [L]), [r*6 + 3] the experts' outputs y (rows x N float32, received
//             order), [r*6 + 4] the combined output (T_r x N float32),
//   [r*6 + 5] int64 [4]: dispatch bytes sent and received (to and from other ranks), what the same
//             rows would send as bf16, combine bytes sent.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstring>
#include <exception>
#include <thread>

#include "grouped_common.hpp"
#include "octet/comm/in_process.hpp"
#include "octet/nn/moe_exchange.hpp"

namespace octet_torch::grouped {
namespace {

constexpr const char* op = "moe_exchange_in_process";

struct rank_inputs {
    at::Tensor x, indices, weights;
};

struct rank_outputs {
    at::Tensor data, scales, expert_rows, y, out, bytes;
};

template <class XR, class WR>
void run_rank(octet::in_process_world& world, int r, const rank_inputs& in, const at::Tensor& w, std::size_t E,
              octet::moe_combine_wire wire, rank_outputs& res) {
    using namespace octet;
    octet::in_process_transport comm(world, r);
    const int P = world.size;
    const std::size_t L = E / static_cast<std::size_t>(P);
    const std::size_t T = static_cast<std::size_t>(in.x.size(0)), d = static_cast<std::size_t>(in.x.size(1)),
                      k = static_cast<std::size_t>(in.indices.size(1)), N = static_cast<std::size_t>(w.size(1));
    moe_exchange_options opt;
    opt.executor = on_host(1);
    opt.expected_ranks = P;
    opt.combine_wire = wire;
    quantized_tensor<XR> xq(T, d);
    if (T && d) quantize<XR>(opt.executor, matrix_ref<const float>(in.x.data_ptr<float>(), T, d), xq.ref());
    dispatch_plan plan(T, k, E);
    moe_exchange xch(P, r, E);
    moe_dispatch_plan_host(comm, matrix_ref<const std::int32_t>(in.indices.data_ptr<std::int32_t>(), T, k), {},
                           plan.ref(), xch.ref(), opt);
    grouped_quantized_tensor<XR> xe(grouped_rows(xch.ref().expert_rows, d));
    const moe_exchange_report dr = moe_dispatch_host(comm, xq.cref(), plan.ref(), xch.ref(), xe.ref(), opt);
    // This rank's experts' weights, each quantized as a matrix of its own.
    std::vector<std::size_t> n_rows(L, N);
    grouped_quantized_tensor<WR> wq(grouped_rows(span<const std::size_t>(n_rows.data(), L), d));
    for (std::size_t e = 0; e < L; ++e)
        if (N && d)
            quantize<WR>(opt.executor, matrix_ref<const float>(w.data_ptr<float>() + (r * L + e) * N * d, N, d),
                         wq.ref().group(e));
    std::vector<quantized_cref<WR>> b;
    for (std::size_t e = 0; e < L; ++e) b.push_back(wq.cref().group(e));
    const std::size_t M = xch.ref().rows();
    res.y = at::zeros({static_cast<int64_t>(M), static_cast<int64_t>(N)}, in.x.options());
    if (M && N)
        grouped_scaled_gemm(opt.executor, xe.cref(), span<const quantized_cref<WR>>(b.data(), b.size()),
                            matrix_ref<float>(res.y.data_ptr<float>(), M, N));
    res.out = at::zeros({static_cast<int64_t>(T), static_cast<int64_t>(N)}, in.x.options());
    const moe_exchange_report cr =
        moe_combine_host(comm, matrix_ref<const float>(res.y.data_ptr<float>(), M, N),
                         matrix_ref<const float>(in.weights.data_ptr<float>(), T, k), plan.ref(), xch.ref(),
                         matrix_ref<float>(res.out.data_ptr<float>(), T, N), opt);
    const at::TensorOptions bytes = in.x.options().dtype(at::kByte);
    res.data = at::empty({static_cast<int64_t>(xe.layout().data_bytes)}, bytes);
    res.scales = at::empty({static_cast<int64_t>(xe.layout().scale_bytes)}, bytes);
    if (xe.layout().data_bytes) std::memcpy(res.data.data_ptr(), xe.cref().data, xe.layout().data_bytes);
    if (xe.layout().scale_bytes) std::memcpy(res.scales.data_ptr(), xe.cref().scales, xe.layout().scale_bytes);
    res.expert_rows = at::empty({static_cast<int64_t>(L)}, in.x.options().dtype(at::kLong));
    for (std::size_t e = 0; e < L; ++e)
        res.expert_rows.data_ptr<int64_t>()[e] = static_cast<int64_t>(xch.ref().expert_rows[e]);
    res.bytes = at::empty({4}, in.x.options().dtype(at::kLong));
    int64_t* v = res.bytes.data_ptr<int64_t>();
    v[0] = static_cast<int64_t>(dr.bytes_sent);
    v[1] = static_cast<int64_t>(dr.bytes_received);
    v[2] = static_cast<int64_t>(dr.bf16_bytes_sent);
    v[3] = static_cast<int64_t>(cr.bytes_sent);
}

std::vector<at::Tensor> moe_exchange_in_process(at::TensorList x, at::TensorList indices, at::TensorList weights,
                                                const at::Tensor& w, int64_t experts, c10::string_view x_recipe,
                                                c10::string_view w_recipe, c10::string_view combine_wire) {
    const std::size_t P = x.size();
    TORCH_CHECK_VALUE(P >= 1 && indices.size() == P && weights.size() == P, where(op, "x/indices/weights"), "hold ",
                      x.size(), ", ", indices.size(), " and ", weights.size(),
                      " tensors; pass one of each per rank (at least one rank)");
    TORCH_CHECK_VALUE(experts >= 1 && experts % static_cast<int64_t>(P) == 0, where(op, "experts"), "is ", experts,
                      "; pass a positive multiple of the rank count ", P);
    check_tensor(w, op, "w", {at::kFloat});
    TORCH_CHECK_VALUE(w.dim() == 3 && w.size(0) == experts && w.is_contiguous(), where(op, "w"), "has shape ",
                      w.sizes(), "; pass every expert's weight as one contiguous experts x N x d float32 tensor");
    octet::moe_combine_wire wire = octet::moe_combine_wire::bf16;
    if (combine_wire == "e4m3_1x128")
        wire = octet::moe_combine_wire::e4m3_1x128;
    else if (combine_wire == "f32")
        wire = octet::moe_combine_wire::f32;
    else
        TORCH_CHECK_VALUE(combine_wire == "bf16", where(op, "combine_wire"), "is '", std::string(combine_wire),
                          "'; pass bf16, e4m3_1x128 or f32");
    std::vector<rank_inputs> in(P);
    for (std::size_t r = 0; r < P; ++r) {
        check_tensor(x[r], op, "x", {at::kFloat});
        check_tensor(weights[r], op, "weights", {at::kFloat});
        check_tensor(indices[r], op, "indices", {at::kLong, at::kInt});
        TORCH_CHECK_VALUE(x[r].dim() == 2 && x[r].size(1) == w.size(2), where(op, "x"), "[", r, "] has shape ",
                          x[r].sizes(), "; pass T x d tokens with d = w's last dimension ", w.size(2));
        TORCH_CHECK_VALUE(indices[r].dim() == 2 && indices[r].size(0) == x[r].size(0) && indices[r].size(1) >= 1 &&
                              weights[r].sizes() == indices[r].sizes(),
                          where(op, "indices/weights"), "[", r, "] have shapes ", indices[r].sizes(), " and ",
                          weights[r].sizes(), "; pass T x k of each for T = ", x[r].size(0), " tokens");
        TORCH_CHECK_VALUE(r == 0 || indices[r].size(1) == indices[0].size(1), where(op, "indices"), "[", r,
                          "] has k = ", indices[r].size(1), ", rank 0 ", indices[0].size(1),
                          "; every rank routes to k experts");
        const at::Tensor idx = indices[r].to(at::kInt).contiguous();
        const std::int32_t* p = idx.data_ptr<std::int32_t>();
        for (int64_t i = 0; i < idx.numel(); ++i)
            TORCH_CHECK_VALUE(p[i] >= 0 && p[i] < experts, where(op, "indices"), "[", r, "] holds expert ", p[i],
                              "; pass expert indices in [0, ", experts, ")");
        in[r] = {x[r].contiguous(), idx, weights[r].contiguous()};
    }
    std::vector<rank_outputs> res(P);
    auto run = [&](auto rx, auto rw) {
        using XR = typename decltype(rx)::type;
        using WR = typename decltype(rw)::type;
        octet::in_process_world world(static_cast<int>(P));
        std::vector<std::exception_ptr> errors(P);
        std::vector<std::thread> threads;
        for (std::size_t r = 0; r < P; ++r)
            threads.emplace_back([&, r] {
                try {
                    run_rank<XR, WR>(world, static_cast<int>(r), in[r], w, static_cast<std::size_t>(experts), wire,
                                     res[r]);
                } catch (...) {
                    errors[r] = std::current_exception();
                }
            });
        for (auto& t : threads) t.join();
        for (auto& e : errors)
            if (e) guarded([&] { std::rethrow_exception(e); });
    };
    namespace rc = octet::recipes;
    if (x_recipe == "blockwise_1x128" && w_recipe == "blockwise_128x128")
        run(type_tag<rc::blockwise_1x128>{}, type_tag<rc::blockwise_128x128>{});
    else if (x_recipe == "mxfp8_e4m3" && w_recipe == "mxfp8_e4m3")
        run(type_tag<rc::mxfp8_e4m3>{}, type_tag<rc::mxfp8_e4m3>{});
    else
        TORCH_CHECK_VALUE(false, where(op, "x_recipe/w_recipe"), "are ", std::string(x_recipe), " x ",
                          std::string(w_recipe),
                          "; pass blockwise_1x128 x blockwise_128x128 or mxfp8_e4m3 x mxfp8_e4m3");
    std::vector<at::Tensor> out;
    for (auto& r : res)
        for (at::Tensor* t : {&r.data, &r.scales, &r.expert_rows, &r.y, &r.out, &r.bytes}) out.push_back(*t);
    return out;
}

}  // namespace
}  // namespace octet_torch::grouped

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "moe_exchange_in_process(Tensor[] x, Tensor[] indices, Tensor[] weights, Tensor w, int experts, str "
        "x_recipe=\"blockwise_1x128\", str w_recipe=\"blockwise_128x128\", str combine_wire=\"bf16\") -> Tensor[]");
}

TORCH_LIBRARY_IMPL(octet, CPU, m) {
    m.impl("moe_exchange_in_process", &octet_torch::grouped::moe_exchange_in_process);
}
