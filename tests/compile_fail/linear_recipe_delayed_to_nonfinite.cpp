// expect: under delayed scaling values above a stale amax must saturate
#include <octet/nn/linear.hpp>
// Delayed scaling over a per-tensor recipe that overflows to Inf/NaN.
using overflowing_e4m3 =
    octet::recipe<octet::e4m3, octet::per_tensor, octet::scale::amax_ratio<0>, octet::scale_storage::f32,
                  octet::round::nearest_even, octet::overflow::to_nonfinite>;
using bad = octet::linear_recipe<overflowing_e4m3, octet::recipes::tensorwise_e4m3, octet::recipes::tensorwise_e5m2,
                                 octet::linear_scaling::delayed>;
constexpr auto s = bad::scaling;
