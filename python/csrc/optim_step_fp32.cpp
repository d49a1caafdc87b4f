// The fused AdamW step with master::fp32, every state codec (optim_adamw.hpp).
#include "optim_adamw.hpp"

namespace octet_torch {
namespace optim {
OCTET_TORCH_STEP_MASTER(step_master_fp32, fp32)
}  // namespace optim
}  // namespace octet_torch
