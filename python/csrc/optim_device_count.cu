// The AdamW ops' CUDA count of non-finite gradients, float32 and bfloat16 (optim_device.hpp).
#include "optim_device.cuh"

template void octet_torch::device::count_nonfinite<float>(const octet::stream_executor&, octet::span<const float>,
                                                          octet::adamw_report*);
template void octet_torch::device::count_nonfinite<octet::bf16>(const octet::stream_executor&,
                                                                octet::span<const octet::bf16>, octet::adamw_report*);
