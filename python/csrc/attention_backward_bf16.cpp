// The attention backward on octet::bf16 operands, every head dim and V scaling (split per dtype so the
// instantiations compile in parallel).
#include "attention_ops.hpp"

namespace octet_torch::attention {
template void run_backward<octet::bf16>(const backward_args&);
}  // namespace octet_torch::attention
