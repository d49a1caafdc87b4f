// The host quantizer against the float64 reference quantizer for custom recipes: other scale
// rules and storages, roundings, overflow and NaN policies, formats and block shapes than the named
// recipes have (tests/host/quant_recipes.cpp has those; the check is tests/support/quant_recipes_check.hpp).
#include <doctest/doctest.h>

#include "support/quant_recipes_check.hpp"

using namespace quant_recipes_test;

TEST_CASE("custom recipes: other rules, storages, roundings, overflows and block shapes") {
    using namespace octet;
    check_all_shapes<recipe<e4m3, block<1, 64>, scale::pow2_ceil>>(2000);
    check_all_shapes<recipe<e4m3, block<1, 32>, scale::pow2_nearest, scale_storage::ue8m0>>(2100);
    check_all_shapes<recipe<e5m2, per_row, scale::amax_ratio<3>>>(2200);
    check_all_shapes<recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::stochastic>>(2300);
    check_all_shapes<
        recipe<e5m2, per_row, scale::amax_ratio<0>, scale_storage::f32, round::nearest_even, overflow::to_nonfinite>>(
        2400);
    check_all_shapes<recipe<e4m3fnuz, block<16, 16>, scale::amax_ratio<0>>>(2500);
    check_all_shapes<recipe<e2m1, block<32, 32>, scale::pow2_floor, scale_storage::ue8m0, round::toward_zero>>(2600);
    check_all_shapes<recipe<e2m3, block<1, 16>, scale::amax_ratio<0>, scale_storage::e4m3, round::stochastic>>(2700);
    check_all_shapes<recipe<float_format<3, 4>, block<1, 32>, scale::pow2_ceil, scale_storage::f32, round::up,
                            overflow::to_nonfinite>>(2800);
    // nan_policy::per_element (not the default) with float scales, 2-D blocks, per tensor and
    // stochastic rounding
    using per_element = nan_policy::per_element;
    check_all_shapes<recipe<e4m3, block<1, 128>, scale::amax_ratio<0>, scale_storage::f32, round::nearest_even,
                            overflow::saturate, per_element>>(2900);
    check_all_shapes<recipe<e4m3, per_tensor, scale::amax_ratio<0>, scale_storage::f32, round::nearest_even,
                            overflow::saturate, per_element>>(2950);
    check_all_shapes<recipe<e2m1, block<16, 16>, scale::pow2_ceil, scale_storage::ue8m0, round::stochastic,
                            overflow::saturate, per_element>>(2970);
}
