// The linear ops for octet::linear_recipes::tensorwise_delayed (see linear_common.hpp).
#include "linear_common.hpp"

namespace octet_torch::linear {
template std::vector<at::Tensor> run_forward<octet::linear_recipes::tensorwise_delayed>(const forward_args&);
template std::vector<at::Tensor> run_backward<octet::linear_recipes::tensorwise_delayed>(const backward_args&);
}  // namespace octet_torch::linear
