"""Gradient codec ops and the DDP communication hook built on them.

Ops (CPU kernels from octet/codec/codec.hpp; the message format is octet/codec/wire.hpp):
  encode_gradient(x, format, transform, block, scale_block, seed, stochastic, first_index,
                  random_stream, residual=None) -> message (uint8)
  decode_gradient(message, n, first_index=0) -> n float32 (ValueError on a corrupted message)
  encode_gradient_transformed / decode_gradient_transformed: the same in rotated coordinates (the
      stages of octet's compressed all-reduce, which sums messages there)
  encoded_size, transform_length, codec_error_bound, codec_shards, allreduce_error_bound: queries.

``compressed_allreduce`` runs octet's compressed all-reduce (octet/comm/allreduce.hpp) with
torch.distributed as the transport: the communication is Python's (a ProcessGroup cannot be passed
into a custom op), the ops stay local. ``codec_hook`` with a ``CodecHookState`` is a
DistributedDataParallel communication hook over it.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from .._library import load

load("codec")
_ops = torch.ops.octet

WIRE_FORMATS = ("e4m3", "e5m2", "mxfp8", "nvfp4")
TRANSFORMS = ("hadamard", "identity")


@dataclass(frozen=True)
class CodecConfig:
    """octet::codec_config. format: e4m3, e5m2, mxfp8 or nvfp4; transform: hadamard or identity;
    block: the Hadamard block (a power of two in [16, 32768]); scale_block: elements per scale (0:
    the format's own); seed: the Hadamard signs' and stochastic rounding's seed (a 64-bit pattern);
    stochastic: round coordinates stochastically (unbiased) instead of to nearest-even."""

    format: str = "e4m3"
    transform: str = "hadamard"
    block: int = 1024
    scale_block: int = 0
    seed: int = 0
    stochastic: bool = False

    def _layout_args(self):
        return (self.format, self.transform, self.block, self.scale_block)

    def _args(self):
        return (*self._layout_args(), self.seed, self.stochastic)

    def with_seed(self, seed: int) -> "CodecConfig":
        # Ops take int64; a seed is a 64-bit pattern, so wrap it into int64's range.
        seed &= (1 << 64) - 1
        return CodecConfig(self.format, self.transform, self.block, self.scale_block,
                           seed - (1 << 64) if seed >= 1 << 63 else seed, self.stochastic)


# ---- fake (meta) kernels: the message size comes from the size query (plain ints) ----


def _concrete(n):
    # Message sizes are not polynomials in n (the Hadamard block depends on n): specialize.
    return int(n)


@torch.library.register_fake("octet::encode_gradient")
def _encode_fake(x, format="e4m3", transform="hadamard", block=1024, scale_block=0, seed=0, stochastic=False,
                 first_index=0, random_stream=0, residual=None):
    size = _ops.encoded_size(_concrete(x.numel()), format, transform, block, scale_block)
    return x.new_empty((size,), dtype=torch.uint8)


@torch.library.register_fake("octet::encode_gradient_transformed")
def _encode_transformed_fake(y, n, format="e4m3", transform="hadamard", block=1024, scale_block=0, seed=0,
                             stochastic=False, first_index=0, random_stream=0, residual=None):
    size = _ops.encoded_size(_concrete(n), format, transform, block, scale_block)
    return y.new_empty((size,), dtype=torch.uint8)


@torch.library.register_fake("octet::decode_gradient")
def _decode_fake(message, n, first_index=0):
    return message.new_empty((n,), dtype=torch.float32)


@torch.library.register_fake("octet::decode_gradient_transformed")
def _decode_transformed_fake(message, n, format="e4m3", transform="hadamard", block=1024, scale_block=0, seed=0,
                             stochastic=False, first_index=0):
    return message.new_empty((_ops.transform_length(_concrete(n), transform, block),), dtype=torch.float32)


# ---- Python API over the ops ----


def _config(config):
    return CodecConfig() if config is None else config


def encoded_size(n: int, config: Optional[CodecConfig] = None) -> int:
    """Bytes of the message that carries n elements under config."""
    return _ops.encoded_size(n, *_config(config)._layout_args())


def transform_length(n: int, config: Optional[CodecConfig] = None) -> int:
    """L: the coordinates n elements transform to (n, or n rounded up to the effective block)."""
    c = _config(config)
    return _ops.transform_length(n, c.transform, c.block)


def error_bound(n: int, config: Optional[CodecConfig] = None) -> Tuple[float, float]:
    """octet::error_bound: one encode/decode of x errs by ||x_hat - x|| <= relative ||x|| + absolute."""
    c = _config(config)
    rel, ab = _ops.codec_error_bound(n, *c._layout_args(), c.stochastic)
    return rel, ab


def encode_gradient(x: torch.Tensor, config: Optional[CodecConfig] = None, *, first_index: int = 0,
                    random_stream: int = 0, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Encodes a contiguous float32 tensor (all its elements, in memory order) as one wire message.

    first_index: the global index of x's first element (a shard's offset; the Hadamard signs and the
    rounding bits depend on it). random_stream: added to the stochastic-rounding stream (ranks use
    different ones). residual: error feedback, updated in place (x + residual is encoded, and the
    residual becomes what that encoding lost): float32 or bfloat16 with x's element count, or uint8
    in the e4m3 block layout of octet/codec/feedback.hpp (residual_bytes(n, "e4m3") bytes)."""
    return _ops.encode_gradient(x, *_config(config)._args(), first_index, random_stream, residual)


def decode_gradient(message: torch.Tensor, n: int, *, first_index: int = 0) -> torch.Tensor:
    """Validates a message (ValueError if it is corrupted, truncated, or carries other elements than
    [first_index, first_index + n)) and decodes it to n float32 values."""
    return _ops.decode_gradient(message, n, first_index)


def encode_gradient_transformed(y: torch.Tensor, n: int, config: Optional[CodecConfig] = None, *,
                                first_index: int = 0, random_stream: int = 0,
                                residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Encodes L = transform_length(n) coordinates already in config's rotated coordinates (a sum
    of decode_gradient_transformed results) as the message of n elements. A residual is in the
    original coordinates (n elements)."""
    return _ops.encode_gradient_transformed(y, n, *_config(config)._args(), first_index, random_stream, residual)


def decode_gradient_transformed(message: torch.Tensor, n: int, config: Optional[CodecConfig] = None, *,
                                first_index: int = 0) -> torch.Tensor:
    """The L dequantized coordinates of a message, without the inverse transform. The message must
    have been encoded with config (ValueError otherwise): only then do rotated sums make sense."""
    return _ops.decode_gradient_transformed(message, n, *_config(config)._args(), first_index)


def residual_bytes(n: int, storage: str) -> int:
    """Bytes of an n-element residual (octet::residual_bytes): f32 4n, bf16 2n, e4m3 n + 4 ceil(n/128)."""
    if storage == "f32":
        return 4 * n
    if storage == "bf16":
        return 2 * n
    if storage == "e4m3":
        return n + 4 * ((n + 127) // 128)
    raise ValueError(f"octet: argument 'storage' is {storage!r}; pass f32, bf16 or e4m3")


def new_residual(n: int, storage: str = "f32") -> torch.Tensor:
    """A zeroed residual of n elements: float32 (f32), bfloat16 (bf16) or uint8 (e4m3 block layout;
    all-zero bytes are a zero residual)."""
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.uint8}.get(storage)
    if dtype is None:
        raise ValueError(f"octet: argument 'storage' is {storage!r}; pass f32, bf16 or e4m3")
    return torch.zeros(residual_bytes(n, storage) if storage == "e4m3" else n, dtype=dtype)


def residual_values(residual: torch.Tensor, n: int) -> torch.Tensor:
    """A residual as n float32 values (decodes the e4m3 layout)."""
    if residual.dtype != torch.uint8:
        return residual.float()
    if n == 0:
        return torch.zeros(0)
    blocks = (n + 127) // 128
    full = torch.zeros(blocks * 132, dtype=torch.uint8)
    full[: residual.numel()] = residual
    full = full.view(blocks, 132)
    scales = full[:, :4].contiguous().view(torch.float32)
    codes = full[:, 4:].contiguous().view(torch.float8_e4m3fn).float()
    return (codes * scales).reshape(-1)[:n]


def _residual_slice(residual: Optional[torch.Tensor], begin: int, count: int) -> Optional[torch.Tensor]:
    """Elements [begin, begin + count) of a residual (begin a multiple of 128 for e4m3)."""
    if residual is None:
        return None
    if residual.dtype != torch.uint8:
        return residual[begin: begin + count]
    offset = begin // 128 * 132
    return residual[offset: offset + residual_bytes(count, "e4m3")]


# ---- the compressed all-reduce over torch.distributed ----


def _group_info(group):
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group)


def _stop_everywhere(failure: Optional[Exception], rank: int, group, what: str, device,
                     op: str = "octet.compressed_allreduce"):
    """Every rank learns whether any rank failed, so that none is left waiting in a later collective
    (the error-flag all-reduce of allreduce.hpp; on the tensors' device: NCCL takes CUDA tensors)."""
    import torch.distributed as dist

    flag = torch.tensor([0 if failure is None else rank + 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if failure is not None:
        raise ValueError(f"{op}: {what} on rank {rank}: {failure}") from failure
    if flag.item():
        raise ValueError(f"{op}: rank {flag.item() - 1} received an invalid {what}; every rank stops")


def compressed_allreduce(x: torch.Tensor, config: Optional[CodecConfig] = None, *, group=None,
                         residual: Optional[torch.Tensor] = None,
                         reduced_residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The sum over the ranks of ``group`` of every rank's contiguous float32 tensor x, through
    octet's codec; returns a new 1-D tensor, bit-identical on every rank (x is not changed).

    The algorithm of octet/comm/allreduce.hpp: x is cut into world shards (codec_shards); every rank
    encodes each shard (random_stream 1 + rank; residual: the stage-1 error feedback of all of x);
    an all-to-all hands rank s the world messages of shard s, which it validates, decodes in rotated
    coordinates and sums in rank order; it re-encodes the sum (reduced_residual: stage-2 feedback of
    its own shard, codec_shards(...)[rank + 1] - [rank] elements); an all-gather hands every rank
    every reduced message, and every rank decodes the same bytes. Every rank must pass the same
    config and size. A message that fails validation makes every rank raise ValueError.
    Error without feedback: allreduce_error_bound. x, the residuals and every buffer live on x's
    device: the CPU with gloo, CUDA with NCCL (the codec ops' CUDA kernels; each decode reads its
    message's header on the host, and the error flags are read there too)."""
    import torch.distributed as dist

    if x.dtype != torch.float32:
        raise TypeError(f"octet.compressed_allreduce: argument 'x' has dtype {x.dtype}; pass float32")
    if not x.is_contiguous():
        raise ValueError("octet.compressed_allreduce: argument 'x' is not contiguous; pass .contiguous()")
    c = _config(config)
    world, rank = _group_info(group)
    n = x.numel()
    bounds = _ops.codec_shards(n, world, *c._layout_args())
    counts = [bounds[r + 1] - bounds[r] for r in range(world)]
    sizes = [encoded_size(k, c) for k in counts]
    flat = x.reshape(-1)

    # Stage 1: one message per shard, to the shard's owner.
    messages = [
        encode_gradient(flat[bounds[r]: bounds[r + 1]], c, first_index=bounds[r], random_stream=1 + rank,
                        residual=_residual_slice(residual, bounds[r], counts[r]))
        for r in range(world)
    ]
    dev = x.device
    received = torch.empty(world * sizes[rank], dtype=torch.uint8, device=dev)
    dist.all_to_all_single(received, torch.cat(messages), output_split_sizes=[sizes[rank]] * world,
                           input_split_sizes=sizes, group=group)

    # Stage 2: sum my shard in rotated coordinates (rank order, as the C++ does) and re-encode it.
    failure, reduced = None, None
    mine, first = counts[rank], bounds[rank]
    try:
        total = None
        for r in range(world):
            part = decode_gradient_transformed(received[r * sizes[rank]: (r + 1) * sizes[rank]], mine, c,
                                               first_index=first)
            total = part if total is None else total + part
        reduced = encode_gradient_transformed(total, mine, c, first_index=first, random_stream=0,
                                              residual=reduced_residual)
    except (ValueError, TypeError, RuntimeError) as e:
        failure = e
    _stop_everywhere(failure, rank, group, "stage-1 message", dev)

    # Stage 3: every rank gathers and decodes every reduced message (all-gather needs equal sizes).
    largest = max(sizes)
    padded = torch.zeros(largest, dtype=torch.uint8, device=dev)
    padded[: sizes[rank]] = reduced
    gathered = [torch.empty(largest, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    failure = None
    try:
        for r in range(world):
            out[bounds[r]: bounds[r + 1]] = decode_gradient(gathered[r][: sizes[r]], counts[r],
                                                            first_index=bounds[r])
    except (ValueError, TypeError, RuntimeError) as e:
        failure = e
    _stop_everywhere(failure, rank, group, "reduced message", dev)
    return out


def allreduce_error_bound(n: int, world: int, sum_of_norms: float, norm_of_sum: float,
                          config: Optional[CodecConfig] = None) -> float:
    """octet::allreduce_error_bound: worst-case ||compressed_allreduce - exact sum|| without feedback,
    given sum_r ||x_r|| and ||sum_r x_r||."""
    c = _config(config)
    return _ops.allreduce_error_bound(n, world, sum_of_norms, norm_of_sum, *c._layout_args(), c.stochastic)


# ---- the DDP communication hook ----

# DDP checks the hook's annotations (GradBucket is absent from torch builds without distributed).
_GradBucket = getattr(torch.distributed, "GradBucket", object)


class CodecHookState:
    """State of ``codec_hook`` (pass it to DistributedDataParallel.register_comm_hook).

    config: the CodecConfig every rank uses (must be equal on all ranks; checked collectively the
        first time each bucket layout is seen). Step t encodes with seed config.seed + t (fresh
        Hadamard signs and rounding bits every step; the residuals live in original coordinates, so
        they survive the change).
    process_group: the group to reduce over (None: the default group).
    feedback: storage of the stage-1 error-feedback residual of every bucket ("f32", "bf16", "e4m3"
        or None for none): what encoding a bucket lost is added to that bucket the next step.
    reduced_feedback: storage of the stage-2 residual (the loss of re-encoding the summed shard this
        rank owns), or None.
    Held: ``residuals[bucket index]`` and ``reduced_residuals[bucket index]`` (tensors, see
    new_residual), ``step`` (iterations completed). A bucket whose parameters change (DDP rebuilds
    its buckets after the first iteration) restarts from a zero residual.
    """

    def __init__(self, config: Optional[CodecConfig] = None, *, process_group=None,
                 feedback: Optional[str] = "f32", reduced_feedback: Optional[str] = "f32"):
        for name, storage in (("feedback", feedback), ("reduced_feedback", reduced_feedback)):
            if storage not in (None, "f32", "bf16", "e4m3"):
                raise ValueError(f"octet.CodecHookState: argument '{name}' is {storage!r}; pass f32, bf16, e4m3 "
                                 "or None")
        self.config = _config(config)
        self.process_group = process_group
        self.feedback = feedback
        self.reduced_feedback = reduced_feedback
        self.step = 0
        self.residuals: Dict[int, torch.Tensor] = {}
        self.reduced_residuals: Dict[int, torch.Tensor] = {}
        self._layouts: Dict[int, tuple] = {}

    def _descriptor(self, n: int, device) -> torch.Tensor:
        c = self.config
        storages = (None, "f32", "bf16", "e4m3")
        return torch.tensor([n, WIRE_FORMATS.index(c.format) if c.format in WIRE_FORMATS else -1,
                             TRANSFORMS.index(c.transform) if c.transform in TRANSFORMS else -1, c.block,
                             c.scale_block, c.with_seed(c.seed).seed, int(c.stochastic), self.step,
                             storages.index(self.feedback), storages.index(self.reduced_feedback)],
                            dtype=torch.int64, device=device)

    def _prepare(self, index: int, layout: tuple, n: int, device):
        """Residuals of a bucket (on its device); on a new layout, zeroes them and checks that all
        ranks agree."""
        if self._layouts.get(index) == layout:
            return
        import torch.distributed as dist

        world, rank = _group_info(self.process_group)
        mine = self._descriptor(n, device)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=self.process_group)
        for r, d in enumerate(everyone):
            if not torch.equal(d, everyone[0]):
                raise ValueError(f"octet.codec_hook: ranks 0 and {r} disagree on bucket {index} (size, config, "
                                 f"step or feedback: {everyone[0].tolist()} vs {d.tolist()}); every rank must use "
                                 "the same CodecHookState settings")
        bounds = _ops.codec_shards(n, world, *self.config._layout_args())
        self.residuals.pop(index, None)
        self.reduced_residuals.pop(index, None)
        if self.feedback:
            self.residuals[index] = new_residual(n, self.feedback).to(device)
        if self.reduced_feedback:
            self.reduced_residuals[index] = new_residual(bounds[rank + 1] - bounds[rank],
                                                         self.reduced_feedback).to(device)
        self._layouts[index] = layout


def codec_hook(state: CodecHookState, bucket: _GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over the group through octet's codec
    with error feedback (compressed_allreduce, then / world size). Every rank returns the same bits,
    so replicas stay bit-identical. Runs synchronously (the returned future is complete): per bucket
    an all-to-all, an all-gather and two one-integer all-reduces (the error flags). The bucket's
    device: CPU tensors over gloo, CUDA tensors over NCCL (residuals and messages on the GPU; the
    decodes and the error flags are read on the host, so a CUDA bucket synchronizes)."""
    grad = bucket.buffer()
    index = bucket.index()
    params = bucket.parameters()
    layout = (grad.numel(), tuple(id(p) for p in params), tuple(tuple(p.shape) for p in params))
    state._prepare(index, layout, grad.numel(), grad.device)
    world, _ = _group_info(state.process_group)
    config = state.config.with_seed(state.config.seed + state.step)
    total = compressed_allreduce(grad.detach().float().contiguous(), config, group=state.process_group,
                                 residual=state.residuals.get(index),
                                 reduced_residual=state.reduced_residuals.get(index))
    average = total.div_(world).to(grad.dtype)
    if bucket.is_last():
        state.step += 1
    fut = torch.futures.Future()
    fut.set_result(average)
    return fut


# ---- FSDP2's reduce-scatter through the codec ----


def _reduce_scatter_base():
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:  # a torch without FSDP2's comm hooks
        return object
    return ReduceScatter


class CompressedReduceScatter(_reduce_scatter_base()):
    """FSDP2's gradient reduce-scatter through octet's codec, with error feedback: give it to a
    module with ``fully_shard(...).set_custom_reduce_scatter(CompressedReduceScatter(config))``, or
    to every FSDP2 module of a model with ``compress_reduce_scatter(model, config)``; one object per
    module (it holds that module's residual).

    A call receives FSDP2's flat input (world chunks of the output's size: chunk r is rank r's shard
    of every parameter's gradient). Each rank encodes every chunk but its own (first_index r x shard
    size, random_stream 1 + rank, step t with seed config.seed + t) and an all-to-all hands each rank
    the world - 1 messages of its chunk; it validates and decodes them, and adds them to its own chunk
    in rank order (its own chunk never leaves it, so it is exact). A message that fails validation
    makes every rank raise ValueError. The sum is divided by the world size for ReduceOp.AVG.

    feedback: storage of the residual ("f32", "bf16", "e4m3" or None): what encoding the chunks lost is
    added to them the next step. The residual belongs to the sender and covers every chunk it sends,
    (world - 1) / world of the module's unsharded gradient, so it cannot be sharded like the
    parameters without losing what it compensates; "e4m3" keeps it in about 1.03 bytes per element.
    Held: ``residuals`` (by destination rank, each of the shard's size, see new_residual; None before
    the first call or without feedback), ``step``,
    ``bytes_sent`` (the last call's message bytes, this rank) and ``bytes_sent_total``.

    Checkpoints: ``state_dict()`` / ``load_state_dict()`` carry the step and the residuals, so that a
    resumed run continues bit for bit. The residuals are this rank's (what it owes each destination
    rank), not shards of a parameter: save each rank's own (torch.save per rank; DCP would keep one
    rank's copy of a plain tensor) and load it on the same rank of the same world size. A state saved
    on another world size or rank is refused at the first call after loading, one whose residual bytes
    do not match their CRC-32 at loading; either way nothing is loaded.
    Error without feedback, per call and rank: at most the sum over the world - 1 chunks received of
    error_bound(shard size, config) applied to each sender's chunk (see error_bound)."""

    def __init__(self, config: Optional[CodecConfig] = None, *, feedback: Optional[str] = "f32"):
        if feedback not in (None, "f32", "bf16", "e4m3"):
            raise ValueError(f"octet.CompressedReduceScatter: argument 'feedback' is {feedback!r}; pass f32, bf16, "
                             "e4m3 or None")
        self.config = _config(config)
        self.feedback = feedback
        self.residuals: Optional[Dict[int, torch.Tensor]] = None
        self._shard = -1
        self.step = 0
        self.bytes_sent = 0
        self.bytes_sent_total = 0
        self._where = None  # (world, rank) of the last call
        self._loaded_where = None  # (world, rank) a loaded state was saved on, until the next call checks it

    def state_dict(self) -> Dict[str, Any]:
        """The step, the residuals (by destination rank, with their CRC-32) and where they were made."""
        residuals = {r: e.detach().cpu().clone() for r, e in (self.residuals or {}).items()}
        world, rank = self._where if self._where is not None else (None, None)
        return {"format": "octet.CompressedReduceScatter/1", "feedback": self.feedback, "step": self.step,
                "shard": self._shard, "world": world, "rank": rank, "residuals": residuals,
                "crc32": {r: _crc32(e) for r, e in residuals.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Takes a state_dict() of this rank's reduce-scatter after checking all of it (nothing is
        loaded from a state that fails)."""
        name = "octet.CompressedReduceScatter.load_state_dict"
        if not isinstance(state, dict) or state.get("format") != "octet.CompressedReduceScatter/1":
            raise ValueError(f"{name}: argument 'state' is not a CompressedReduceScatter state_dict()")
        if state["feedback"] != self.feedback:
            raise ValueError(f"{name}: the state's residuals are stored as {state['feedback']!r}, this "
                             f"reduce-scatter's as {self.feedback!r}; build it with feedback={state['feedback']!r}")
        residuals = state["residuals"]
        for r, e in residuals.items():
            if _crc32(e) != state["crc32"].get(r):
                raise ValueError(f"{name}: the residual for destination rank {r} does not match its CRC-32 (a "
                                 "corrupted checkpoint); nothing was loaded")
        self.residuals = {r: e.clone() for r, e in residuals.items()} if residuals else None
        self._shard = state["shard"]
        self.step = state["step"]
        self._loaded_where = (state["world"], state["rank"]) if state["world"] is not None else None

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        import torch.distributed as dist

        name = "octet.CompressedReduceScatter"
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError(f"{name}: FSDP2 asked for reduce op {op}; this reduce-scatter sums (SUM) or averages "
                             "(AVG): leave FSDP2's gradient_divide_factor unset")
        if async_op:
            raise ValueError(f"{name}: async_op=True was asked; this reduce-scatter runs synchronously")
        world, rank = _group_info(group)
        if self._loaded_where is not None and self._loaded_where != (world, rank):
            saved_world, saved_rank = self._loaded_where
            raise ValueError(f"{name}: the loaded residuals were saved by rank {saved_rank} of {saved_world}, and this "
                             f"is rank {rank} of {world}: a residual belongs to its sender and destination ranks; "
                             "load each rank's own state on the same world size, or start without it")
        self._loaded_where = None
        self._where = (world, rank)
        shard = output_tensor.numel()
        if input_tensor.numel() != world * shard:
            raise ValueError(f"{name}: the input has {input_tensor.numel()} elements, not world ({world}) x the "
                             f"output's {shard}")
        x = input_tensor.reshape(-1).float().contiguous()
        peers = [r for r in range(world) if r != rank]
        if self.feedback and (self.residuals is None or self._shard != shard):
            # a new layout (first call, or FSDP2's shards changed): start from zero
            self.residuals = {r: new_residual(shard, self.feedback).to(x.device) for r in peers}
        elif self.feedback:
            self.residuals = {r: e.to(x.device) for r, e in self.residuals.items()}
        self._shard = shard
        c = self.config.with_seed(self.config.seed + self.step)
        size = encoded_size(shard, c)
        messages = [encode_gradient(x[r * shard: (r + 1) * shard], c, first_index=r * shard, random_stream=1 + rank,
                                    residual=self.residuals[r] if self.feedback else None) for r in peers]
        splits = [0 if r == rank else size for r in range(world)]
        received = torch.empty((world - 1) * size, dtype=torch.uint8, device=x.device)
        dist.all_to_all_single(received, torch.cat(messages) if messages else received, output_split_sizes=splits,
                               input_split_sizes=splits, group=group)
        failure, total = None, None
        try:
            at = 0
            for r in range(world):
                if r == rank:
                    part = x[r * shard: (r + 1) * shard]
                else:
                    part = decode_gradient(received[at: at + size], shard, first_index=rank * shard)
                    at += size
                total = part.clone() if total is None else total.add_(part)
        except (ValueError, TypeError, RuntimeError) as e:
            failure = e
        _stop_everywhere(failure, rank, group, "message", x.device, name)
        if op == dist.ReduceOp.AVG:
            total.div_(world)
        output_tensor.copy_(total.view(output_tensor.shape))
        self.step += 1
        self.bytes_sent = size * len(peers)
        self.bytes_sent_total += self.bytes_sent
        return None


def _crc32(t: torch.Tensor) -> int:
    import zlib

    return zlib.crc32(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def compress_reduce_scatter(model: torch.nn.Module, config: Optional[CodecConfig] = None, *,
                            feedback: Optional[str] = "f32") -> Dict[str, CompressedReduceScatter]:
    """Gives every FSDP2 module of ``model`` (fully_shard applied) its own CompressedReduceScatter;
    returns them by module name (read their bytes_sent there)."""
    from torch.distributed.fsdp import FSDPModule

    comms = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            comms[name] = CompressedReduceScatter(config, feedback=feedback)
            m.set_custom_reduce_scatter(comms[name])
    if not comms:
        raise ValueError("octet.compress_reduce_scatter: argument 'model' has no FSDP2 module; apply fully_shard "
                         "first")
    return comms
