// expect: use linear_scaling::current with HadamardWgrad
#include <octet/nn/linear.hpp>
// The rotated weight-gradient inputs under delayed scaling (otherwise valid per-tensor recipes).
using bad = octet::linear_recipe<octet::recipes::tensorwise_e4m3, octet::recipes::tensorwise_e4m3,
                                 octet::recipes::tensorwise_e5m2, octet::linear_scaling::delayed,
                                 /*StochasticGradients=*/false, /*HadamardWgrad=*/true>;
constexpr auto s = bad::scaling;
