// examples/common/corpus.hpp: the text the programs train on (characters as tokens, the
// last 10% held out) and the windows a step samples from it. Shared by the training program and
// the RL program (examples/09_rl).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace common {

struct corpus {
    std::vector<char> alphabet;  // token id -> character
    std::vector<std::int32_t> train, heldout;
    std::int32_t id(char c) const {
        const auto it = std::lower_bound(alphabet.begin(), alphabet.end(), c);
        return it != alphabet.end() && *it == c ? static_cast<std::int32_t>(it - alphabet.begin()) : 0;
    }
    std::string text(const std::vector<std::int32_t>& ids) const {
        std::string s;
        for (auto t : ids) s += alphabet[static_cast<std::size_t>(t)];
        return s;
    }
};

inline corpus load_corpus(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read the corpus " + path + " (pass --corpus PATH)");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    corpus c;
    c.alphabet.assign(text.begin(), text.end());
    std::sort(c.alphabet.begin(), c.alphabet.end());
    c.alphabet.erase(std::unique(c.alphabet.begin(), c.alphabet.end()), c.alphabet.end());
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = c.id(text[i]);
    const std::size_t split = text.size() - text.size() / 10;
    c.train.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split));
    c.heldout.assign(ids.begin() + static_cast<std::ptrdiff_t>(split), ids.end());
    return c;
}

/// Fills `out` with `batch` windows of seq_len + 1 tokens of `src`, at offsets drawn from (seed, step, rank).
inline void sample_batch(const std::vector<std::int32_t>& src, int seq_len, int batch, std::uint64_t seed,
                         std::int64_t step, int rank, std::int32_t* out) {
    std::mt19937_64 g(seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step) * 1000003ull +
                      static_cast<std::uint64_t>(rank));
    std::uniform_int_distribution<std::size_t> start(0, src.size() - static_cast<std::size_t>(seq_len) - 2);
    for (int b = 0; b < batch; ++b) {
        const std::size_t s = start(g);
        std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(s), seq_len + 1, out + b * (seq_len + 1));
    }
}

}  // namespace common
