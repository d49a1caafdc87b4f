// expect: delayed scaling derives one scale per tensor from an amax history
#include <octet/nn/linear.hpp>
// Delayed scaling over block-scaled recipes.
using bad = octet::linear_recipe<octet::recipes::blockwise_1x128, octet::recipes::blockwise_128x128,
                                 octet::recipes::blockwise_1x128, octet::linear_scaling::delayed>;
constexpr auto s = bad::scaling;
