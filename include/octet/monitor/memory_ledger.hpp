// octet/monitor/memory_ledger.hpp: where training memory goes, by category.
//
// A ledger holds bytes for five categories (weights, gradients, optimizer state, activations,
// temporaries). It answers two kinds of question:
//   * accounting: set or add bytes per category, or record allocations and frees and keep the
//     running and peak totals (per category and overall);
//   * what-if: `scaled({{category, factor}, ...})` returns the ledger with some categories scaled,
//     so that "halve the weights" or "FP8 optimizer state" can be priced against the whole.
//
// The arithmetic is exact in double for any realistic byte count. The ledger is plain host code.
// Byte counts and factors must be finite and non-negative (octet::error otherwise), so totals,
// peaks and the JSON (which has no inf or NaN) always hold plain numbers; `scaled()` rejects a
// category named twice (its factors would multiply) rather than guess which one was meant.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include "octet/core/check.hpp"

namespace octet {

enum class memory_category : int { weights = 0, gradients, optimizer_state, activations, temporaries };
inline constexpr int memory_category_count = 5;

inline const char* memory_category_name(memory_category c) {
    switch (c) {
        case memory_category::weights:
            return "weights";
        case memory_category::gradients:
            return "gradients";
        case memory_category::optimizer_state:
            return "optimizer_state";
        case memory_category::activations:
            return "activations";
        case memory_category::temporaries:
            return "temporaries";
    }
    return "unknown";
}

class memory_ledger {
public:
    memory_ledger() = default;
    memory_ledger(std::initializer_list<std::pair<memory_category, double>> entries) {
        for (const auto& [c, bytes] : entries) set(c, bytes);
    }

    /// Sets a category's current bytes (and raises its peak if needed).
    void set(memory_category c, double bytes) {
        check_bytes("octet::memory_ledger::set", bytes);
        commit("octet::memory_ledger::set", c, bytes);
    }
    /// Records an allocation of `bytes` in a category.
    void allocate(memory_category c, double bytes) {
        check_bytes("octet::memory_ledger::allocate", bytes);
        commit("octet::memory_ledger::allocate", c, current_[index(c)] + bytes);
    }
    /// Records a free; freeing more than is held is an error (it means the books are wrong).
    void release(memory_category c, double bytes) {
        check_bytes("octet::memory_ledger::release", bytes);
        OCTET_REQUIRE(bytes <= current_[index(c)], "octet::memory_ledger::release", "bytes",
                      detail::message("is ", bytes, " but ", memory_category_name(c), " holds ", current_[index(c)],
                                      "; release only what was allocated"));
        current_[index(c)] -= bytes;
    }

    double bytes(memory_category c) const { return current_[index(c)]; }
    double peak(memory_category c) const { return peak_[index(c)]; }
    double total() const {
        double t = 0;
        for (double b : current_) t += b;
        return t;
    }
    /// Largest total seen at any moment (not the sum of per-category peaks).
    double peak_total() const { return peak_total_; }
    /// Fraction of the current total held by a category (0 when the ledger is empty).
    double share(memory_category c) const { return total() > 0 ? bytes(c) / total() : 0.0; }

    /// A copy with the listed categories' bytes multiplied by their factors: the what-if price of
    /// a change (e.g. FP8 weights: {{weights, 0.5}} against bf16).
    memory_ledger scaled(std::initializer_list<std::pair<memory_category, double>> factors) const {
        memory_ledger out;
        out.current_ = current_;
        std::array<bool, memory_category_count> seen{};
        for (const auto& [c, f] : factors) {
            OCTET_REQUIRE(std::isfinite(f) && f >= 0, "octet::memory_ledger::scaled", "factor",
                          detail::message("is ", f, " for ", memory_category_name(c), "; pass a finite factor >= 0"));
            OCTET_REQUIRE(!seen[static_cast<std::size_t>(index(c))], "octet::memory_ledger::scaled", "factors",
                          detail::message("name ", memory_category_name(c), " twice; give each category one factor"));
            seen[static_cast<std::size_t>(index(c))] = true;
            out.current_[index(c)] *= f;
        }
        OCTET_REQUIRE(std::isfinite(out.total()), "octet::memory_ledger::scaled", "factors",
                      "make the total overflow; pass realistic factors");
        out.update_peaks();  // a what-if ledger's peaks are its own totals
        return out;
    }

    std::string to_markdown(double unit = 1.0, const char* unit_name = "bytes") const {
        std::ostringstream os;
        os << "| category | " << unit_name << " | share | peak |\n|---|---|---|---|\n";
        for (int i = 0; i < memory_category_count; ++i) {
            const auto c = static_cast<memory_category>(i);
            os << "| " << memory_category_name(c) << " | " << bytes(c) / unit << " | " << 100.0 * share(c) << "% | "
               << peak(c) / unit << " |\n";
        }
        os << "| total | " << total() / unit << " | 100% | " << peak_total() / unit << " |\n";
        return os.str();
    }

    std::string to_json() const {
        std::ostringstream os;
        os.precision(17);
        os << "{";
        for (int i = 0; i < memory_category_count; ++i) {
            const auto c = static_cast<memory_category>(i);
            os << "\"" << memory_category_name(c) << "\": {\"bytes\": " << bytes(c) << ", \"peak\": " << peak(c)
               << "}, ";
        }
        os << "\"total\": " << total() << ", \"peak_total\": " << peak_total() << "}";
        return os.str();
    }

private:
    static void check_bytes(const char* fn, double bytes) {
        OCTET_REQUIRE(std::isfinite(bytes) && bytes >= 0, fn, "bytes",
                      detail::message("is ", bytes, "; pass a finite, non-negative size"));
    }
    /// Sets a category to `value` unless the total would overflow to infinity (then throws).
    void commit(const char* fn, memory_category c, double value) {
        double t = value;
        for (int i = 0; i < memory_category_count; ++i) t += i == index(c) ? 0.0 : current_[i];
        OCTET_REQUIRE(std::isfinite(t), fn, "bytes",
                      detail::message("makes the ledger's total overflow (", memory_category_name(c), " would hold ",
                                      value, "); pass a realistic size"));
        current_[index(c)] = value;
        update_peaks();
    }
    static int index(memory_category c) {
        const int i = static_cast<int>(c);
        OCTET_REQUIRE(i >= 0 && i < memory_category_count, "octet::memory_ledger", "category",
                      "is not a memory_category");
        return i;
    }
    void update_peaks() {
        for (int i = 0; i < memory_category_count; ++i)
            if (current_[i] > peak_[i]) peak_[i] = current_[i];
        if (total() > peak_total_) peak_total_ = total();
    }

    std::array<double, memory_category_count> current_{};
    std::array<double, memory_category_count> peak_{};
    double peak_total_ = 0;
};

}  // namespace octet
