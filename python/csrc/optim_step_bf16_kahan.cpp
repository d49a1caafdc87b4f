// The fused AdamW step with master::bf16_kahan, every state codec (optim_adamw.hpp).
#include "optim_adamw.hpp"

namespace octet_torch {
namespace optim {
OCTET_TORCH_STEP_MASTER(step_master_bf16_kahan, bf16_kahan)
}  // namespace optim
}  // namespace octet_torch
