// expect: pass GRecipe with round::nearest_even
#include <octet/nn/linear.hpp>
// StochasticGradients over a gradient recipe that rounds toward zero.
using truncating_e5m2 = octet::recipe<octet::e5m2, octet::per_tensor, octet::scale::amax_ratio<0>,
                                      octet::scale_storage::f32, octet::round::toward_zero>;
using bad = octet::linear_recipe<octet::recipes::tensorwise_e4m3, octet::recipes::tensorwise_e4m3, truncating_e5m2,
                                 octet::linear_scaling::current, /*StochasticGradients=*/true>;
constexpr auto s = bad::scaling;
