// The fused AdamW step with master::bf16_nearest, every state codec (optim_adamw.hpp).
#include "optim_adamw.hpp"

namespace octet_torch {
namespace optim {
OCTET_TORCH_STEP_MASTER(step_master_bf16_nearest, bf16_nearest)
}  // namespace optim
}  // namespace octet_torch
