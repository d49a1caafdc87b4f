// examples/common/model_file.hpp: a trained model's weights in a file, with the model's
// configuration, so that another program (the RL program, examples/09_rl) starts from them.
//
//   common::write_model_file(path, config, params);           // example_08_training --save-models
//   std::vector<float> p = common::read_model_file(path, config);   // throws if the file's model differs
//
// Layout (little-endian): 8-byte magic "octetmd1", 9 int32 (vocab, d_model, layers, heads_q,
// heads_kv, head_dim, d_ff, seq_len, tied_head), uint64 parameter count, the float32 parameters in
// parameter_layout's order.
#pragma once

#include "config.hpp"
#include "model.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace common {

namespace model_file_detail {
inline constexpr char magic[8] = {'o', 'c', 't', 'e', 't', 'm', 'd', '1'};
inline std::array<std::int32_t, 9> fields(const model_config& c) {
    return {c.vocab, c.d_model, c.layers, c.heads_q, c.heads_kv, c.head_dim, c.d_ff, c.seq_len, c.tied_head ? 1 : 0};
}
inline const char* const field_names[9] = {"vocab",    "d_model", "layers",  "heads_q",  "heads_kv",
                                           "head_dim", "d_ff",    "seq_len", "tied_head"};
}  // namespace model_file_detail

inline void write_model_file(const std::string& path, const model_config& c, const std::vector<float>& params) {
    if (params.size() != transformer::parameter_count(c))
        throw std::invalid_argument("write_model_file: params has " + std::to_string(params.size()) +
                                    " floats but the model has " + std::to_string(transformer::parameter_count(c)));
    std::ofstream f(path, std::ios::binary);
    const auto fl = model_file_detail::fields(c);
    const std::uint64_t n = params.size();
    f.write(model_file_detail::magic, sizeof model_file_detail::magic);
    f.write(reinterpret_cast<const char*>(fl.data()), sizeof(std::int32_t) * fl.size());
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(reinterpret_cast<const char*>(params.data()), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw std::runtime_error("cannot write the model file " + path);
}

/// The parameters stored in `path`; throws std::runtime_error naming the first configuration
/// field that differs from `c` (or a file that is not a model file, or is truncated).
inline std::vector<float> read_model_file(const std::string& path, const model_config& c) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read the model file " + path);
    char m[8] = {};
    std::array<std::int32_t, 9> fl{};
    std::uint64_t n = 0;
    f.read(m, sizeof m);
    if (!f || std::memcmp(m, model_file_detail::magic, sizeof m) != 0)
        throw std::runtime_error(path + " is not a model file (written by example_08_training --save-models)");
    f.read(reinterpret_cast<char*>(fl.data()), sizeof(std::int32_t) * fl.size());
    f.read(reinterpret_cast<char*>(&n), sizeof n);
    if (!f) throw std::runtime_error(path + " is truncated");
    const auto want = model_file_detail::fields(c);
    for (std::size_t i = 0; i < want.size(); ++i)
        if (fl[i] != want[i])
            throw std::runtime_error(path + " holds a model with " + model_file_detail::field_names[i] + " = " +
                                     std::to_string(fl[i]) + ", this program's has " + std::to_string(want[i]));
    if (n != transformer::parameter_count(c)) throw std::runtime_error(path + " has the wrong parameter count");
    std::vector<float> p(n);
    f.read(reinterpret_cast<char*>(p.data()), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw std::runtime_error(path + " is truncated");
    return p;
}

}  // namespace common
