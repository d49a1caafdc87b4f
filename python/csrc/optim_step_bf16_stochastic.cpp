// The fused AdamW step with master::bf16_stochastic, every state codec (optim_adamw.hpp).
#include "optim_adamw.hpp"

namespace octet_torch {
namespace optim {
OCTET_TORCH_STEP_MASTER(step_master_bf16_stochastic, bf16_stochastic)
}  // namespace optim
}  // namespace octet_torch
