// The quantize op's stochastically-rounded instantiations: float32 input, every named recipe
// (quant_quantize_instances.hpp).
#include "quant_quantize_instances.hpp"

#define OCTET_TORCH_EXTERN
OCTET_TORCH_RECIPES(OCTET_TORCH_QUANTIZE_STOCHASTIC_F32)
