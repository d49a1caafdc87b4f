// expect: LR must be an octet::linear_recipe<...>
#include <octet/nn/linear.hpp>
// A context over a plain recipe instead of a linear recipe.
constexpr auto s = sizeof(octet::linear_context<octet::recipes::tensorwise_e4m3>);
