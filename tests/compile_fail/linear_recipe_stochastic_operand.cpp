// expect: the layer draws random bits for output gradients only
#include <octet/nn/linear.hpp>
// A gradient recipe that asks for stochastic rounding itself, instead of StochasticGradients = true.
using stochastic_e5m2 = octet::recipe<octet::e5m2, octet::per_tensor, octet::scale::amax_ratio<0>,
                                      octet::scale_storage::f32, octet::round::stochastic>;
using bad = octet::linear_recipe<octet::recipes::tensorwise_e4m3, octet::recipes::tensorwise_e4m3, stochastic_e5m2>;
constexpr auto s = bad::scaling;
