// expect: XRecipe, WRecipe and GRecipe must be octet::recipe<...>
#include <octet/nn/linear.hpp>
// An activation recipe that is a format, not a recipe.
using bad = octet::linear_recipe<octet::e4m3, octet::recipes::tensorwise_e4m3, octet::recipes::tensorwise_e5m2>;
constexpr auto s = bad::scaling;
