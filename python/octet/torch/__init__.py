"""octet inside PyTorch: ``torch.ops.octet`` ops and the Python API over them.

Ops (CPU kernels from octet's host paths): cast, decode, quantize, dequantize, recipe_info,
scaled_mm, linear_forward / linear_backward (Float8Linear), attention, the AdamW step, the
gradient codec. CUDA kernels (octet's stream paths, on torch's current stream, scratch from torch's
caching allocator) where the libraries were built with them (cuda_kernels()): quantize, dequantize,
scaled_mm, adamw_step, adamw_count_nonfinite (so AdamW steps CUDA parameters).
RunReport: octet's run report (monitor op library).

Developing one op family: OCTET_TORCH_FAMILIES=quant,gemm (a comma-separated list) imports only
those families' modules, so a build tree that has only their libraries can be tested.
"""

import os as _os

_only = _os.environ.get("OCTET_TORCH_FAMILIES")


def _wanted(family):
    return _only is None or family in _only.split(",")


from ._quant import (  # noqa: F401
    FORMATS,
    RECIPES,
    QuantizedTensor,
    cast,
    code_dtype,
    cuda_kernels,
    decode,
    dequantize,
    layout,
    quantize,
    recipe_info,
)
from .activations import compress_activations  # noqa: F401  (quant family only)
if _wanted("gemm"):
    from ._gemm import SCALED_MM_PAIRS, gemm_error_bound, scaled_mm  # noqa: F401
if _wanted("linear"):
    from .linear import (  # noqa: F401
        LINEAR_RECIPES,
        ConversionReport,
        Float8Conv1D,
        Float8Linear,
        LinearRecipe,
        convert,
        linear_state,
        load_linear_state,
        sync_amax_histories,
    )
    if _wanted("gemm"):
        from .fsdp import enable_fp8_all_gather, precompute_fp8_scales  # noqa: F401
if _wanted("codec"):
    from .distributed import (  # noqa: F401
        CodecConfig,
        CodecHookState,
        CompressedReduceScatter,
        codec_hook,
        compress_reduce_scatter,
        compressed_allreduce,
        decode_gradient,
        encode_gradient,
        encoded_size,
    )
if _wanted("optim"):
    from .optim import AdamW  # noqa: F401
if _wanted("attention"):
    from ._attention import (  # noqa: F401
        AttentionFunction,
        AttentionTelemetry,
        attention,
        hf_attention_forward,
        register_hf_attention,
        scaled_dot_product_attention,
    )
if _wanted("monitor"):
    from .monitor import RunReport  # noqa: F401

if _wanted("codec"):
    comm_hook = codec_hook  # the name issue 11 uses
if _wanted("grouped"):
    try:
        from .moe import (  # noqa: F401
            GROUPED_RECIPES,
            GroupedLinear,
            MoE,
            expert_parallel_combine,
            expert_parallel_dispatch,
            expert_parallel_experts,
            expert_parallel_moe,
            register_hf_experts,
            scaled_grouped_mm,
        )
    except ImportError as _e:
        # A build tree whose op libraries predate the grouped family (_grouped.so not built yet) keeps
        # the other families importable; `import octet.torch.moe` still raises, saying what to build.
        if "_grouped.so" not in str(_e):
            raise
