// The linear ops for octet::linear_recipes::nvfp4 (see linear_common.hpp).
#include "linear_common.hpp"

namespace octet_torch::linear {
template std::vector<at::Tensor> run_forward<octet::linear_recipes::nvfp4>(const forward_args&);
template std::vector<at::Tensor> run_backward<octet::linear_recipes::nvfp4>(const backward_args&);
}  // namespace octet_torch::linear
