// examples/01_formats: the facts of every octet format, and why the place of rounding matters.
//
// Run:  cmake --workflow --preset demo        (or build/default/examples/example_01_formats)
//
// Part 1 prints each named format's traits (read from the constexpr members of its type) and a
// few encodings under each rounding mode. Part 2 shows the effect this library is built around:
// an update smaller than half a unit in the last place vanishes under round-to-nearest, every
// step, forever; stochastic rounding keeps it in expectation; a compensated sum keeps it exactly.
#include <octet/octet.hpp>

#include <cmath>
#include <cstdio>

namespace {

template <class Fmt>
void print_facts() {
    std::printf("  %-9s %4d %4d %4d %14.6g %12.6g %12.6g   %-3s  %-5s  ", octet::format_name<Fmt>(), Fmt::bits,
                Fmt::exponent_bits, Fmt::bias, static_cast<double>(Fmt::max_finite),
                static_cast<double>(Fmt::min_normal), static_cast<double>(Fmt::min_subnormal),
                Fmt::has_inf ? "yes" : "no", Fmt::is_signed ? "yes" : "no");
    if (Fmt::has_nan)
        std::printf("0x%02x\n", static_cast<unsigned>(Fmt::nan_code));
    else
        std::printf("none\n");
}

template <class Fmt>
void print_roundings(float x) {
    using namespace octet;
    const auto show = [](std::uint8_t c) { return static_cast<double>(decode<Fmt>(c)); };
    std::printf("  %-9s x=%-9g nearest=%-9g toward0=%-9g up=%-9g down=%-9g\n", format_name<Fmt>(),
                static_cast<double>(x), show(encode<Fmt, round::nearest_even>(x)),
                show(encode<Fmt, round::toward_zero>(x)), show(encode<Fmt, round::up>(x)),
                show(encode<Fmt, round::down>(x)));
}

/// Round to the grid {k * 0.1}: nearest, or stochastic with a uniform u in [0, 1).
double to_grid_nearest(double v) {
    return std::round(v * 10.0) / 10.0;
}
double to_grid_stochastic(double v, double u) {
    const double lo = std::floor(v * 10.0) / 10.0;
    return (v - lo) * 10.0 > u ? lo + 0.1 : lo;
}

}  // namespace

int main() {
    using namespace octet;
    std::printf("octet %s: formats\n\n", OCTET_VERSION_STRING);
    std::printf("  %-9s %4s %4s %4s %14s %12s %12s   %-3s  %-5s  %s\n", "format", "bits", "exp", "bias", "max finite",
                "min normal", "min subnorm", "Inf", "sign", "NaN code");
    print_facts<e4m3>();
    print_facts<e5m2>();
    print_facts<e4m3fnuz>();
    print_facts<e5m2fnuz>();
    print_facts<e2m3>();
    print_facts<e3m2>();
    print_facts<e2m1>();
    print_facts<ue8m0>();
    using e3m4 = float_format<3, 4>;
    std::printf("  (custom E3M4, IEEE-like with bias 3, declared as float_format<3, 4>:)\n");
    print_facts<e3m4>();

    std::printf("\nOne value, four roundings:\n");
    print_roundings<e4m3>(3.3f);
    print_roundings<e4m3>(-3.3f);
    print_roundings<e2m1>(2.6f);
    print_roundings<e5m2>(1000.0f);
    std::printf("  e4m3 of 500: saturate -> %g, to_nonfinite -> %g (E4M3 has no Inf)\n",
                static_cast<double>(decode<e4m3>(encode<e4m3>(500.0f))),
                static_cast<double>(decode<e4m3>(encode<e4m3, round::nearest_even, overflow::to_nonfinite>(500.0f))));

    std::printf("\nWhere rounding happens matters: 100 updates of +0.03 to a value of 1.0 stored on a grid of 0.1\n");
    const int steps = 100;
    double nearest = 1.0, stochastic = 1.0, compensated = 1.0, residual = 0.0;
    const philox_stream rng{2026, 0};
    for (int i = 0; i < steps; ++i) {
        nearest = to_grid_nearest(nearest + 0.03);
        stochastic = to_grid_stochastic(stochastic + 0.03, rng.uniform(static_cast<std::uint64_t>(i)));
        const double wanted = compensated + 0.03 + residual;  // carry what rounding dropped
        compensated = to_grid_nearest(wanted);
        residual = wanted - compensated;
    }
    std::printf("  exact            %.2f\n", 1.0 + steps * 0.03);
    std::printf("  round to nearest %.2f   (1.03 rounds back to 1.0 every step: the updates vanish)\n", nearest);
    std::printf("  stochastic       %.2f   (each step rounds up with probability 0.3: right in expectation)\n",
                stochastic);
    std::printf("  compensated      %.2f   (the dropped remainder is carried into the next step)\n", compensated);

    std::printf(
        "\nThe same in bf16: a weight of 1.0 receiving 1000 updates of 1e-3 (bf16 ulp at 1.0 is 2^-7 = 0.0078)\n");
    bf16 w_nearest = to_bf16(1.0f), w_stochastic = to_bf16(1.0f), w_kahan = to_bf16(1.0f);
    float kahan_c = 0.0f;
    for (int i = 0; i < 1000; ++i) {
        w_nearest = to_bf16(to_float(w_nearest) + 1e-3f);
        w_stochastic =
            to_bf16_stochastic(to_float(w_stochastic) + 1e-3f, rng.bits(1000u + static_cast<std::uint64_t>(i)));
        const float y = 1e-3f - kahan_c;  // Kahan: compensation buffer in float beside the bf16 weight
        const bf16 t = to_bf16(to_float(w_kahan) + y);
        kahan_c = (to_float(t) - to_float(w_kahan)) - y;
        w_kahan = t;
    }
    std::printf("  exact                  %.4f\n", 1.0 + 1000 * 1e-3);
    std::printf("  bf16 round to nearest  %.4f   (stalled at the start)\n", static_cast<double>(to_float(w_nearest)));
    std::printf("  bf16 stochastic        %.4f   (Philox, seed 2026: reproducible)\n",
                static_cast<double>(to_float(w_stochastic)));
    std::printf("  bf16 + Kahan buffer    %.4f   (exact to bf16 resolution; residual in the buffer %.2e)\n",
                static_cast<double>(to_float(w_kahan)), static_cast<double>(-kahan_c));
    return 0;
}
