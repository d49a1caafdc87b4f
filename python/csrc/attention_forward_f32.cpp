// The attention forward on float operands, every head dim and V scaling (split per dtype so the
// instantiations compile in parallel).
#include "attention_ops.hpp"

namespace octet_torch::attention {
template void run_forward<float>(const forward_args&);
}  // namespace octet_torch::attention
