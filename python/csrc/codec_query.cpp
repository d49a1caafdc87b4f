// What Python needs to allocate, shard and bound without running the codec (no tensor arguments):
//   octet::encoded_size(n, format, transform, block, scale_block) -> message bytes of n elements
//   octet::transform_length(n, transform, block) -> L, the coordinates n elements transform to
//   octet::codec_error_bound(n, format, ..., stochastic) -> [relative, absolute] (octet::error_bound)
//   octet::codec_shards(n, world, format, transform, block, scale_block) -> world + 1 shard boundaries
//       (octet::allreduce_shard: rank r owns [b[r], b[r + 1]))
//   octet::allreduce_error_bound(n, world, sum_of_norms, norm_of_sum, format, ...) -> float
#include "codec_torch.hpp"
#include "octet/comm/allreduce.hpp"

namespace octet_torch {
namespace {

int64_t encoded_size(int64_t n, c10::string_view format, c10::string_view transform, int64_t block,
                     int64_t scale_block) {
    constexpr const char* op = "encoded_size";
    const auto cfg = codec_config_of(format, transform, block, scale_block, 0, false, op);
    const std::uint64_t count = non_negative(n, op, "n");
    return guarded([&] { return static_cast<int64_t>(octet::wire_layout_of(cfg, count).total_bytes); });
}

int64_t transform_length(int64_t n, c10::string_view transform, int64_t block) {
    constexpr const char* op = "transform_length";
    const auto cfg = codec_config_of("e4m3", transform, block, 0, 0, false, op);
    const std::uint64_t count = non_negative(n, op, "n");
    return guarded([&] { return static_cast<int64_t>(octet::wire_layout_of(cfg, count).coded); });
}

std::vector<double> codec_error_bound(int64_t n, c10::string_view format, c10::string_view transform, int64_t block,
                                      int64_t scale_block, bool stochastic) {
    constexpr const char* op = "codec_error_bound";
    const auto cfg = codec_config_of(format, transform, block, scale_block, 0, stochastic, op);
    const std::uint64_t count = non_negative(n, op, "n");
    const octet::codec_bound b = guarded([&] { return octet::error_bound(cfg, count); });
    return {b.relative, b.absolute};
}

std::vector<int64_t> codec_shards(int64_t n, int64_t world, c10::string_view format, c10::string_view transform,
                                  int64_t block, int64_t scale_block) {
    constexpr const char* op = "codec_shards";
    const auto cfg = codec_config_of(format, transform, block, scale_block, 0, false, op);
    const std::uint64_t count = non_negative(n, op, "n");
    TORCH_CHECK_VALUE(world >= 1 && world <= (1 << 20), where(op, "world"), "is ", world,
                      "; pass the number of ranks (>= 1)");
    std::vector<int64_t> b(static_cast<std::size_t>(world) + 1);
    for (int r = 0; r < world; ++r)
        b[r] = static_cast<int64_t>(octet::allreduce_shard(cfg, count, static_cast<int>(world), r).begin);
    b[world] = static_cast<int64_t>(count);
    return b;
}

double allreduce_error_bound(int64_t n, int64_t world, double sum_of_norms, double norm_of_sum, c10::string_view format,
                             c10::string_view transform, int64_t block, int64_t scale_block, bool stochastic) {
    constexpr const char* op = "allreduce_error_bound";
    const auto cfg = codec_config_of(format, transform, block, scale_block, 0, stochastic, op);
    const std::uint64_t count = non_negative(n, op, "n");
    TORCH_CHECK_VALUE(world >= 1 && world <= (1 << 20), where(op, "world"), "is ", world,
                      "; pass the number of ranks (>= 1)");
    return guarded(
        [&] { return octet::allreduce_error_bound(cfg, count, static_cast<int>(world), sum_of_norms, norm_of_sum); });
}

}  // namespace
}  // namespace octet_torch

TORCH_LIBRARY_FRAGMENT(octet, m) {
    m.def(
        "encoded_size(int n, str format=\"e4m3\", str transform=\"hadamard\", int block=1024, int scale_block=0) -> "
        "int");
    m.def("transform_length(int n, str transform=\"hadamard\", int block=1024) -> int");
    m.def(
        "codec_error_bound(int n, str format=\"e4m3\", str transform=\"hadamard\", int block=1024, int "
        "scale_block=0, bool stochastic=False) -> float[]");
    m.def(
        "codec_shards(int n, int world, str format=\"e4m3\", str transform=\"hadamard\", int block=1024, int "
        "scale_block=0) -> int[]");
    m.def(
        "allreduce_error_bound(int n, int world, float sum_of_norms, float norm_of_sum, str format=\"e4m3\", str "
        "transform=\"hadamard\", int block=1024, int scale_block=0, bool stochastic=False) -> float");
}

TORCH_LIBRARY_IMPL(octet, CompositeExplicitAutograd, m) {
    m.impl("encoded_size", &octet_torch::encoded_size);
    m.impl("transform_length", &octet_torch::transform_length);
    m.impl("codec_error_bound", &octet_torch::codec_error_bound);
    m.impl("codec_shards", &octet_torch::codec_shards);
    m.impl("allreduce_error_bound", &octet_torch::allreduce_error_bound);
}
