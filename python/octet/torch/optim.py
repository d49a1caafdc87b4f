"""AdamW on compressed moments: octet's fused step (octet/optim/adamw.hpp) as a torch optimizer.

Ops (torch.ops.octet): adamw_step (mutates the parameter and its state in place), adamw_state_sizes,
adamw_count_nonfinite.

Parameters and master weights. As in bitsandbytes' 8-bit and torchao's low-bit optimizers, the
parameter itself is the master weight; the optimizer keeps no second copy of it:
  * master="fp32": the parameter is float32 and is updated in float32;
  * master="bf16_stochastic" / "bf16_nearest": the parameter is bfloat16 and is rounded back to
    bfloat16 each step (stochastically with Philox bits from (seed, step, element), or to nearest,
    which stalls small updates: do not train with it);
  * master="bf16_kahan": the parameter is bfloat16 and the optimizer state holds a bfloat16
    compensation buffer with what rounding dropped (the weight is param + compensation; the
    forward pass reads the parameter alone).
A parameter whose dtype does not fit its group's master policy is refused (TypeError) when added.

Moments: per parameter two codes tensors (float32, bfloat16 or uint8, one code per element) and two
uint8 tensors of the codecs' per-group meta (floats, stored as raw bytes). Codecs: fp32, bf16,
bf16_stochastic, e4m3_scaled, e4m3_expanded, dynamic8 (octet/optim/state_codec.hpp gives their
error bounds); this build needs m_codec == v_codec.

Sharded parameters (DTensor, as FSDP2's fully_shard makes them). Each rank steps its own shard, and
the result is the same, bit for bit, as one process stepping the whole parameter with the same
gradient, whatever the number of ranks:
  * a parameter sharded along dim 0 (FSDP2's default) whose rows hold a multiple of 256 elements
    steps its shard in place: its codec groups and 256-element blocks never straddle two rows, so a
    shard's state is the slice of the whole parameter's state, and the shard's stochastic-rounding
    stream starts at its global element offset. Its state tensors are DTensors sharded like it
    (codes [rows, row elements], meta [rows, meta bytes per row]), so torch.distributed.checkpoint
    saves them from N processes and loads them on M by slicing, and the run continues bit-identically.
  * any other DTensor parameter (rows of another length, as biases and norm weights have: 1 element
    per row; other shard dimensions; replicated) is gathered whole (its parameter and gradient,
    once per step), stepped on every rank as one process would, and its shard written back; its
    state is a plain tensor, the same on every rank (torchao's and bitsandbytes' low-bit optimizers
    likewise keep small tensors out of their block layout).
All DTensor parameters must live on one 1-D device mesh. With DTensor parameters the skip_step
decision and ``report`` are sums over the mesh's ranks (a plain tensor parameter counted on each).

Reproducibility: every parameter owns an element offset (its start in one flat buffer of the
optimizer's parameters in param_groups order, each rounded up to 256), so stochastic rounding draws
distinct bits per parameter. state_dict() holds the codes and meta tensors, the step count and
offset of every parameter, and the seed and codecs of every group; load_state_dict() restores them
bit for bit (no dtype casts), so a resumed run continues bit-identically. Unlike torch's optimizers,
state_dict() returns copies of the state tensors (a transient second copy of the state: about 2
bytes a parameter with 8-bit moments): a load that writes into them in place, as
torch.distributed.checkpoint.load does into get_optimizer_state_dict's tensors, cannot reach the live
state before load_state_dict has checked it.

Checked loading. state_dict() adds to each parameter's state a "crc32" of its state tensors: for a
parameter stepped by rows, an int64 DTensor [rows, 5] sharded like it (the CRC-32 of each row of
m_codes, m_meta, v_codes, v_meta, compensation, started at the row's global index, so that
torch.distributed.checkpoint reshards it with the rows it checks); otherwise an int64 tensor [5] of
the whole tensors' CRC-32. They are computed on the host: each state_dict() reads the whole state
once, at about 1.3 GB/s on one core for rows of 4 KiB. load_state_dict() checks every parameter's
state before it assigns anything and raises ValueError naming the parameter, the state tensor and
the rows: a missing key, a dtype or size that the codecs do not store, a plain tensor where the
parameter is sharded by rows (or the reverse), a state saved by one rank on another number of ranks
(a rank's state_dict() holds its rows only: reshard through torch.distributed.checkpoint), or bytes
that fail their CRC-32 (corrupted, or another rank's rows). A state without "crc32" (saved before
it existed) loads unchecked. The check is agreed over the DTensor parameters' mesh (one
all_gather_object): a rank that refuses its state makes every rank raise before any assigns.
torch's own path (dcp.load into get_model_state_dict and get_optimizer_state_dict, then
set_model_state_dict / set_optimizer_state_dict) thus leaves the optimizer as it was on every rank
when a CRC-32 fails on any, but not the model: get_model_state_dict returns the live parameters, and
dcp.load has written the checkpoint's values into them before any octet code runs (torch offers no
hook there; tests/python/test_fsdp.py shows the state left). The error says so.
octet.torch.fsdp.load_checkpoint stages and checks everything (model, optimizer, every rank) before
it assigns anything: use it.
"""

import math
import zlib
from typing import Any, Dict, Iterable, List, Optional

import torch

from .._library import load

load("optim")
_ops = torch.ops.octet

# The state codecs and master-weight policies the step takes (python/csrc/registry.hpp).
CODECS = tuple(_ops.adamw_codec_names())
DEFAULT_CODEC = "e4m3_expanded"
MASTERS = tuple(_ops.adamw_master_names())
NONFINITE_POLICIES = ("skip_step", "zero_block")
REPORT_FIELDS = ("nonfinite_gradients", "blocks_zeroed", "skipped")

_CODE_DTYPES = {4: torch.float32, 2: torch.bfloat16, 1: torch.uint8}
_BLOCK = 256  # octet::optim_block: offsets of shards and parameters are multiples of it
# A parameter's state tensors, in the order of the columns of its "crc32"
STATE_TENSORS = ("m_codes", "m_meta", "v_codes", "v_meta", "compensation")
_STATE_SCALARS = ("step", "element_offset", "m_codec", "v_codec", "master")


# ---- fake (meta) kernels ----


@torch.library.register_fake("octet::adamw_step")
def _adamw_step_fake(params, compensation, m_codes, m_meta, v_codes, v_meta, grads, m_codec, v_codec, master, lr,
                     beta1, beta2, eps, weight_decay, step, seed, on_nonfinite, element_offset):
    return params.new_empty((3,), dtype=torch.int64)


@torch.library.register_fake("octet::adamw_count_nonfinite")
def _adamw_count_nonfinite_fake(grads):
    return grads.new_empty((), dtype=torch.int64)


def encode_moment(x: torch.Tensor, codec: str, moment: int, seed: int = 0, step: int = 0):
    """(codes, meta) of float32 moments as ``codec`` stores them (moment 1: m, 2: v); CPU."""
    return _ops.adamw_encode_moment(x.detach().float().reshape(-1).contiguous().cpu(), codec, moment, seed, step)


def decode_moment(codes: torch.Tensor, meta: torch.Tensor, codec: str, moment: int) -> torch.Tensor:
    """The float32 moments a state holds (what the step uses); CPU."""
    return _ops.adamw_decode_moment(codes.cpu(), meta.cpu(), codec, moment)


# ---- state layout ----


def state_sizes(m_codec: str, v_codec: str, master: str, n: int) -> Dict[str, Any]:
    """What one parameter of n elements needs: code dtypes and meta bytes of both moments, the
    compensation's element count and the parameter's dtype."""
    mb, mm, vb, vm, comp, pb = _ops.adamw_state_sizes(m_codec, v_codec, master, n)
    return {"m_code_dtype": _CODE_DTYPES[mb], "m_meta_bytes": mm, "v_code_dtype": _CODE_DTYPES[vb],
            "v_meta_bytes": vm, "compensation": comp, "param_dtype": _CODE_DTYPES[pb]}


def new_state(param: torch.Tensor, m_codec: str, v_codec: str, master: str) -> Dict[str, torch.Tensor]:
    """Zeroed state tensors for one parameter (zeros are the valid initial state of every codec)."""
    s = state_sizes(m_codec, v_codec, master, param.numel())
    z = lambda n, dt: torch.zeros(n, dtype=dt, device=param.device)  # noqa: E731
    return {"m_codes": z(param.numel(), s["m_code_dtype"]), "m_meta": z(s["m_meta_bytes"], torch.uint8),
            "v_codes": z(param.numel(), s["v_code_dtype"]), "v_meta": z(s["v_meta_bytes"], torch.uint8),
            "compensation": z(s["compensation"], torch.bfloat16)}


def adamw_step(param, state, grad, *, m_codec, v_codec, master, lr, beta1, beta2, eps, weight_decay, step, seed,
               on_nonfinite, element_offset) -> torch.Tensor:
    """One fused step of one parameter (updated in place with its state); returns the int64 [3]
    report (non-finite gradient elements, blocks zeroed, skipped)."""
    return _ops.adamw_step(param, state["compensation"], state["m_codes"], state["m_meta"], state["v_codes"],
                           state["v_meta"], grad, m_codec, v_codec, master, lr, beta1, beta2, eps, weight_decay,
                           step, seed, on_nonfinite, element_offset)


def _device_sums(tensors, width):
    """The element-wise sums of int64 tensors (each `width` counts, or 0-d when width is 1) as
    Python ints: one device-to-host copy per device (a CUDA step's reports are read once per step,
    not once per parameter)."""
    total = [0] * width
    by_device = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t.reshape(width))
    for ts in by_device.values():
        for i, v in enumerate(torch.stack(ts).sum(0).tolist()):
            total[i] += v
    return total


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"octet.torch.AdamW: argument '{name}' is {value!r}; pass one of {', '.join(choices)}")


# ---- sharded parameters (DTensor) ----


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


class _Sharding:
    """How one DTensor parameter steps (see the module docstring): ``by_rows`` (its own shard, in
    place) or gathered whole."""

    def __init__(self, p):
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        self.mesh, self.placements = p.device_mesh, tuple(p.placements)
        if self.mesh.ndim != 1:
            raise ValueError(f"octet.torch.AdamW: a parameter is a DTensor on a {self.mesh.ndim}-D device mesh "
                             f"(placements {self.placements}); this build steps DTensors on a 1-D mesh (FSDP2's "
                             "fully_shard without a replicate dimension)")
        local_shape, offset = compute_local_shape_and_global_offset(p.shape, self.mesh, self.placements)
        self.local_slices = tuple(slice(o, o + n) for o, n in zip(offset, local_shape))
        self.rows = p.shape[0] if p.dim() else 1
        self.row_elems = p.numel() // self.rows if self.rows else 0
        self.first_row = offset[0] if p.dim() else 0
        self.local_rows = local_shape[0] if p.dim() else 1
        placement = self.placements[0]
        self.by_rows = (isinstance(placement, Shard) and placement.dim == 0 and p.dim() >= 1 and self.row_elems > 0
                        and self.row_elems % _BLOCK == 0)
        self.rank = self.mesh.get_local_rank()

    def wrap(self, local_flat, width):
        """A state tensor of this shard as a DTensor [rows, width] sharded like the parameter's rows."""
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local_flat.view(self.local_rows, width), self.mesh, self.placements,
                                  run_check=False, shape=torch.Size((self.rows, width)), stride=(width, 1))


def _all_reduce_sums(values, mesh):
    """Element-wise sums of a list of ints over the mesh's ranks."""
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else mesh.device_type
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, group=mesh.get_group())
    return t.tolist()


def crc32_rows(t: torch.Tensor, rows: int, first_row: int = 0) -> List[int]:
    """The CRC-32 of each of the ``rows`` equal parts of a plain tensor's bytes, row r's started at
    first_row + r (its global index: a row checked at another place fails). rows 0: []."""
    if rows == 0:
        return []
    data = t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
    per = data.size // rows
    return [zlib.crc32(data[r * per:(r + 1) * per], first_row + r) & 0xFFFFFFFF for r in range(rows)]


def _local_rows(t: torch.Tensor, sharding: "_Sharding") -> torch.Tensor:
    """A by-rows state tensor's local part as [local rows, width] (an empty plain tensor: width 0)."""
    local = t.to_local() if isinstance(t, _dtensor_class()) else t
    return local.reshape(sharding.local_rows, -1) if local.numel() else local.new_empty(sharding.local_rows, 0)


def _state_crc(state: Dict[str, Any], sharding: Optional["_Sharding"]) -> torch.Tensor:
    """A parameter's "crc32" (see the module docstring) from its state tensors."""
    device = state["m_codes"].device
    if sharding is not None and sharding.by_rows:
        cols = [crc32_rows(_local_rows(state[k], sharding), sharding.local_rows, sharding.first_row)
                for k in STATE_TENSORS]
        local = torch.tensor(list(zip(*cols)) if sharding.local_rows else [], dtype=torch.int64,
                             device=device).reshape(-1)
        return sharding.wrap(local, len(STATE_TENSORS))
    return torch.tensor([crc32_rows(state[k], 1)[0] for k in STATE_TENSORS], dtype=torch.int64, device=device)


class AdamW(torch.optim.Optimizer):
    """AdamW (PyTorch's formula: decoupled weight decay, bias correction) with compressed moments.

    Args: params, lr, betas, eps, weight_decay as torch.optim.AdamW; m_codec / v_codec (the moment
    codecs, equal in this build: naming one sets both; e4m3_expanded when neither is named), master (see the module docstring: fp32 needs float32 parameters,
    bf16_* bfloat16 ones), seed (Philox seed of stochastic rounding), on_nonfinite:
      * "skip_step": if any gradient of a skip_step group holds a NaN, +-Inf or |g| >= 2^63, no
        parameter is updated this step and no step counter advances (as GradScaler skips);
      * "zero_block": a block of 256 elements with such a gradient keeps its weights and has its
        moments reset; the rest of the parameter steps.
    Every group option may differ per param group. After step(), ``report`` holds that step's sums
    (nonfinite_gradients, blocks_zeroed, skipped: 1 when the step was skipped) and ``totals`` the
    sums since construction (not part of state_dict).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 m_codec: Optional[str] = None, v_codec: Optional[str] = None, master: str = "fp32", seed: int = 0,
                 on_nonfinite: str = "skip_step"):
        # one codec named: both moments use it (this build steps with one codec for both)
        m_codec = m_codec or v_codec or DEFAULT_CODEC
        v_codec = v_codec or m_codec
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, m_codec=m_codec,
                        v_codec=v_codec, master=master, seed=seed, on_nonfinite=on_nonfinite)
        super().__init__(params, defaults)
        self.report = dict.fromkeys(REPORT_FIELDS, 0)
        self.totals = dict.fromkeys(REPORT_FIELDS, 0)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        _check_choice("m_codec", g["m_codec"], CODECS)
        _check_choice("v_codec", g["v_codec"], CODECS)
        _check_choice("master", g["master"], MASTERS)
        _check_choice("on_nonfinite", g["on_nonfinite"], NONFINITE_POLICIES)
        if g["m_codec"] != g["v_codec"]:
            raise ValueError(f"octet.torch.AdamW: argument 'v_codec' is {g['v_codec']!r} and m_codec "
                             f"{g['m_codec']!r}; this build steps with the same codec for both moments")
        if not (0.0 <= g["betas"][0] < 1.0 and 0.0 <= g["betas"][1] < 1.0):
            raise ValueError(f"octet.torch.AdamW: argument 'betas' is {g['betas']}; pass values in [0, 1)")
        if not (g["eps"] > 0 and math.isfinite(g["eps"])):
            raise ValueError(f"octet.torch.AdamW: argument 'eps' is {g['eps']}; pass a finite value > 0")
        if not (int(g["seed"]) == g["seed"] and 0 <= g["seed"] < 2**63):
            raise ValueError(f"octet.torch.AdamW: argument 'seed' is {g['seed']}; pass an integer in [0, 2^63)")
        want = torch.float32 if g["master"] == "fp32" else torch.bfloat16
        for p in g["params"]:
            if p.dtype != want:
                raise TypeError(f"octet.torch.AdamW: a parameter has dtype {p.dtype}; master={g['master']!r} "
                                f"updates {want} parameters in place (the parameter is the master weight)")

    def _element_offsets(self):
        """Each parameter's start in one flat buffer of all parameters (param_groups order, each
        rounded up to 256): disjoint Philox streams for stochastic rounding."""
        offsets, at = {}, 0
        for g in self.param_groups:
            for p in g["params"]:
                offsets[p] = at
                at += -(-p.numel() // _BLOCK) * _BLOCK
        return offsets

    def _init_state(self, p, g, offsets, sharding=None):
        state = self.state[p]
        if not state:
            if sharding is not None and sharding.by_rows:
                local = new_state(p.to_local(), g["m_codec"], g["v_codec"], g["master"])
                row = state_sizes(g["m_codec"], g["v_codec"], g["master"], sharding.row_elems)
                widths = {"m_codes": sharding.row_elems, "v_codes": sharding.row_elems, "m_meta": row["m_meta_bytes"],
                          "v_meta": row["v_meta_bytes"], "compensation": row["compensation"]}
                state.update({k: sharding.wrap(t, widths[k]) if widths[k] else t for k, t in local.items()})
            else:
                state.update(new_state(p, g["m_codec"], g["v_codec"], g["master"]))
            state.update(step=0, element_offset=offsets[p], m_codec=g["m_codec"], v_codec=g["v_codec"],
                         master=g["master"])
        elif (state["m_codec"], state["v_codec"], state["master"]) != (g["m_codec"], g["v_codec"], g["master"]):
            raise ValueError(f"octet.torch.AdamW: a parameter's state was made with m_codec={state['m_codec']!r}, "
                             f"v_codec={state['v_codec']!r}, master={state['master']!r} but its group now says "
                             f"{g['m_codec']!r}, {g['v_codec']!r}, {g['master']!r}; codecs cannot change mid-run")
        return state

    @staticmethod
    def _grad(p):
        g = p.grad
        if g.is_sparse:
            raise TypeError("octet.torch.AdamW: sparse gradients are not supported")
        # torch lays gradients out like their parameters (contiguous here); copy only the odd one out
        return g if g.is_contiguous() else g.contiguous()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        shardings, mesh = self._shardings(work)
        grads = {p: self._step_grad(p, shardings.get(p)) for p, _ in work}
        # A gathered parameter's counts are the same on every rank: its rank 0 reports them.
        counted = {id(p) for p, _ in work if p not in shardings or shardings[p].by_rows or shardings[p].rank == 0}
        # skip_step is a decision over all parameters: scan first (octet::count_nonfinite), and when
        # nothing offends step with zero_block, which then reads each gradient once and is bitwise
        # the same as skip_step on clean gradients.
        skip_groups = {id(p) for p, g in work if g["on_nonfinite"] == "skip_step"}
        bad = _device_sums([_ops.adamw_count_nonfinite(grads[p]) for p, _ in work if id(p) in counted and id(p) in skip_groups], 1)
        if mesh is not None:
            bad = _all_reduce_sums(bad, mesh)
        report = dict.fromkeys(REPORT_FIELDS, 0)
        if bad[0]:
            report.update(nonfinite_gradients=bad[0], skipped=1)
        else:
            offsets = self._element_offsets() if any(not self.state[p] for p, _ in work) else None
            reports = []
            for p, g in work:
                sharding = shardings.get(p)
                state = self._init_state(p, g, offsets, sharding)
                r = self._step_one(p, g, state, grads[p], sharding)
                if id(p) in counted:
                    reports.append(r)
                state["step"] += 1
            sums = _device_sums(reports, 3)
            if mesh is not None:
                sums = _all_reduce_sums(sums, mesh)
            report.update(nonfinite_gradients=sums[0], blocks_zeroed=sums[1])
        self.report = report
        for k in REPORT_FIELDS:
            self.totals[k] += report[k]
        return loss

    @staticmethod
    def _shardings(work):
        """Each DTensor parameter's _Sharding, and their common mesh (None without DTensors)."""
        dtensor = _dtensor_class()
        shardings, mesh = {}, None
        for p, _ in work:
            if dtensor is not None and isinstance(p, dtensor):
                s = shardings[p] = _Sharding(p)
                if mesh is None:
                    mesh = s.mesh
                elif s.mesh != mesh:
                    raise ValueError(f"octet.torch.AdamW: the DTensor parameters live on two device meshes ({mesh} "
                                     f"and {s.mesh}); this build steps the parameters of one mesh per optimizer")
        return shardings, mesh

    def _step_grad(self, p, sharding):
        """The gradient a step reads: the parameter's own, its shard's, or a gathered one whole."""
        if sharding is None:
            return self._grad(p)
        g = p.grad
        if not isinstance(g, _dtensor_class()):
            raise TypeError("octet.torch.AdamW: a DTensor parameter has a plain tensor gradient; give it a "
                            "DTensor gradient placed like the parameter (as FSDP2's backward does)")
        return (g.to_local() if sharding.by_rows else g.full_tensor()).contiguous()

    def _step_one(self, p, g, state, grad, sharding):
        """Steps one parameter (or its shard); returns its int64 [3] report."""
        offset = state["element_offset"]
        if sharding is None:
            param = p
        elif sharding.by_rows:
            param = p.to_local()
            state = {k: (v.to_local().reshape(-1) if k != "step" and isinstance(v, _dtensor_class()) else v)
                     for k, v in state.items()}
            offset += sharding.first_row * sharding.row_elems
        else:
            param = p.full_tensor().contiguous()
        if param.numel() == 0:  # a rank whose shard of the rows is empty
            return torch.zeros(3, dtype=torch.int64, device=param.device)
        beta1, beta2 = g["betas"]
        r = adamw_step(param, state, grad, m_codec=g["m_codec"], v_codec=g["v_codec"], master=g["master"],
                       lr=float(g["lr"]), beta1=float(beta1), beta2=float(beta2), eps=float(g["eps"]),
                       weight_decay=float(g["weight_decay"]), step=state["step"] + 1, seed=int(g["seed"]),
                       on_nonfinite="zero_block", element_offset=offset)
        if sharding is not None and not sharding.by_rows:
            p.to_local().copy_(param[sharding.local_slices])
        return r

    def state_dict(self) -> Dict[str, Any]:
        """torch's state_dict(), each parameter's state with its "crc32" (module docstring)."""
        sd = super().state_dict()
        dtensor = _dtensor_class()
        index = 0
        for g in self.param_groups:
            for p in g["params"]:
                s = self.state.get(p)
                if s and index in sd["state"]:
                    sharding = _Sharding(p) if dtensor is not None and isinstance(p, dtensor) else None
                    # copies: an in-place load into them (dcp.load) must not reach the live state
                    copied = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
                              for k, v in sd["state"][index].items()}
                    sd["state"][index] = {**copied, "crc32": _state_crc(s, sharding)}
                index += 1
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """As torch's, but the state tensors are copied as they are: torch would cast them to the
        parameter's dtype (uint8 codes to bfloat16 values, float32 moments of a bf16 parameter).
        Every parameter's state is checked first (check_state_dict); nothing is assigned unless all
        pass. A state dict of torch.optim.AdamW (its state holds exp_avg and exp_avg_sq) is
        imported: its hyperparameters replace the groups', and each moment is encoded with the
        group's codec (exactly, for fp32); amsgrad and maximize are refused by name."""
        if _is_torch_adamw_state(state_dict):
            state_dict = self._from_torch_adamw(state_dict)
        else:
            self._check_on_every_rank(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            if i in state_dict["state"]:
                self.state[p] = {k: (v.detach().clone().to(p.device) if isinstance(v, torch.Tensor) else v)
                                 for k, v in state_dict["state"][i].items() if k != "crc32"}

    def _check_on_every_rank(self, state_dict: Dict[str, Any]) -> None:
        """check_state_dict, agreed over the device mesh of the DTensor parameters (one
        all_gather_object): a rank that refuses its state makes every rank raise before any assigns
        (a rank's CRC-32s check only its rows; torch's set_optimizer_state_dict runs on every rank).
        Without DTensor parameters, check_state_dict alone."""
        dtensor = _dtensor_class()
        mesh = next((p.device_mesh for g in self.param_groups for p in g["params"]
                     if dtensor is not None and isinstance(p, dtensor)), None)
        failure = None
        try:
            self.check_state_dict(state_dict)
        except Exception as e:  # every rank must reach the agreement below
            failure = e
        if mesh is None or mesh.ndim != 1:
            if failure is not None:
                raise failure
            return
        import torch.distributed as dist

        found = [None] * mesh.size()
        dist.all_gather_object(found, None if failure is None else f"{type(failure).__name__}: {failure}",
                               group=mesh.get_group())
        if failure is not None:
            raise failure
        refused = [(r, m) for r, m in enumerate(found) if m is not None]
        if refused:
            r, m = refused[0]
            raise ValueError(f"octet.torch.AdamW.load_state_dict: rank {r} of {mesh.size()} refused its state ({m}); "
                             "nothing was loaded into the optimizer on any rank")

    def check_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Raises ValueError naming the first parameter whose saved state this optimizer cannot
        take (module docstring: checked loading); changes nothing. Group sizes that differ are left
        to torch's load_state_dict, which names them."""
        groups = state_dict.get("param_groups", [])
        if len(groups) != len(self.param_groups) or any(len(a["params"]) != len(b["params"])
                                                        for a, b in zip(groups, self.param_groups)):
            return
        for saved, g in zip(groups, self.param_groups):
            for i, p in zip(saved["params"], g["params"]):
                s = state_dict.get("state", {}).get(i)
                if s:
                    self._check_param_state(i, p, s)

    @staticmethod
    def _check_param_state(i, p, s) -> None:
        fn = "octet.torch.AdamW.load_state_dict"
        name = f"parameter {i!r} {tuple(p.shape)}"
        missing = [k for k in STATE_TENSORS + _STATE_SCALARS if k not in s]
        if missing:
            raise ValueError(f"{fn}: the state of {name} lacks {', '.join(missing)}; pass a state_dict() of "
                             "octet.torch.AdamW")
        for k, choices in (("m_codec", CODECS), ("v_codec", CODECS), ("master", MASTERS)):
            if s[k] not in choices:
                raise ValueError(f"{fn}: the state of {name} has {k} {s[k]!r}; octet.torch.AdamW knows "
                                 f"{', '.join(choices)}")
        dtensor = _dtensor_class()
        sharding = _Sharding(p) if dtensor is not None and isinstance(p, dtensor) else None
        by_rows = sharding is not None and sharding.by_rows
        sizes = state_sizes(s["m_codec"], s["v_codec"], s["master"], p.numel())
        want = {"m_codes": (p.numel(), sizes["m_code_dtype"]), "m_meta": (sizes["m_meta_bytes"], torch.uint8),
                "v_codes": (p.numel(), sizes["v_code_dtype"]), "v_meta": (sizes["v_meta_bytes"], torch.uint8),
                "compensation": (sizes["compensation"], torch.bfloat16)}
        codecs = f"m_codec {s['m_codec']!r}, v_codec {s['v_codec']!r}, master {s['master']!r}"
        for k, (n, dtype) in want.items():
            v = s[k]
            if not isinstance(v, torch.Tensor) or v.dtype != dtype or v.numel() != n:
                what = f"{v.numel()} elements of {v.dtype}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise ValueError(f"{fn}: {name}'s {k} holds {what}; its state ({codecs}) is {n} elements of {dtype}")
            if not (by_rows and n):
                if dtensor is not None and isinstance(v, dtensor):
                    raise ValueError(f"{fn}: {name}'s {k} is a DTensor sharded over {v.device_mesh.size()} ranks, "
                                     "and this parameter's state is a whole tensor (it is not sharded by rows here); "
                                     "reshard sharded state through torch.distributed.checkpoint")
                continue
            ranks = sharding.mesh.size()
            if not isinstance(v, dtensor):
                raise ValueError(f"{fn}: {name}'s {k} is a plain tensor, and this parameter is sharded by rows over "
                                 f"{ranks} ranks (its state is a DTensor sharded like it); load sharded state "
                                 "through torch.distributed.checkpoint")
            saved_ranks, local = v.device_mesh.size(), v.to_local()
            if saved_ranks != ranks or local.numel() != sharding.local_rows * (n // sharding.rows):
                raise ValueError(f"{fn}: {name}'s {k} was saved sharded over {saved_ranks} ranks ({local.numel()} "
                                 f"elements on this rank), and this parameter is sharded over {ranks} (rank "
                                 f"{sharding.rank} holds {sharding.local_rows} of its {sharding.rows} rows): a rank's "
                                 "state_dict() holds its own rows only; save and load sharded state with "
                                 "torch.distributed.checkpoint (octet.torch.fsdp.save_checkpoint / "
                                 "load_checkpoint), which reshards it")
        crc = s.get("crc32")
        if crc is None:
            return
        got = _state_crc(s, sharding)
        if by_rows:
            if not isinstance(crc, dtensor) or tuple(crc.shape) != tuple(got.shape):
                raise ValueError(f"{fn}: {name}'s crc32 is not an int64 DTensor {tuple(got.shape)} sharded like its "
                                 "rows; pass the state_dict() this optimizer made")
            crc, got = crc.to_local(), got.to_local()
        if crc.shape != got.shape:
            raise ValueError(f"{fn}: {name}'s crc32 has shape {tuple(crc.shape)}, not {tuple(got.shape)}")
        bad = (crc.to(got.device, torch.int64) != got).reshape(-1, len(STATE_TENSORS))
        if bool(bad.any()):
            col = int(bad.any(0).nonzero()[0])
            rows = bad[:, col].nonzero().reshape(-1)
            where = ""
            if by_rows:
                first = sharding.first_row
                where = f" rows {first + int(rows[0])}..{first + int(rows[-1])} (of {sharding.rows})"
            raise ValueError(f"{fn}: {name}'s {STATE_TENSORS[col]}{where} does not match its CRC-32: the bytes are "
                             "corrupted, or are another rank's rows; nothing was loaded into the optimizer. If this "
                             "state came from torch.distributed.checkpoint.load, the model's parameters already hold "
                             "the checkpoint's values (dcp.load writes into get_model_state_dict's live tensors): "
                             "load with octet.torch.fsdp.load_checkpoint, which checks everything before it assigns "
                             "anything")

    # ---- torch.optim.AdamW's state ---------------------------------------------------------------

    def _from_torch_adamw(self, sd: Dict[str, Any]) -> Dict[str, Any]:
        fn = "octet.torch.AdamW.load_state_dict"
        self._refuse_dtensors(fn)
        groups = sd["param_groups"]
        if len(groups) != len(self.param_groups) or any(len(a["params"]) != len(b["params"])
                                                        for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"{fn}: the torch.optim.AdamW state has groups of "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                             f"{[len(g['params']) for g in self.param_groups]}; pass the state of the same parameters")
        for g in groups:
            for flag in ("amsgrad", "maximize"):
                if g.get(flag, False):
                    raise ValueError(f"{fn}: the torch.optim.AdamW state has {flag}=True; octet's AdamW has no {flag}")
        offsets = self._element_offsets()
        state, out_groups = {}, []
        for saved, g in zip(groups, self.param_groups):
            out = {k: v for k, v in g.items() if k != "params"}
            for k in ("lr", "betas", "eps", "weight_decay"):
                if k in saved:
                    out[k] = tuple(saved[k]) if k == "betas" else saved[k]
            out["params"] = list(saved["params"])
            out_groups.append(out)
            for i, p in zip(saved["params"], g["params"]):
                s = sd["state"].get(i)
                if not s:
                    continue
                if s["exp_avg"].numel() != p.numel():
                    raise ValueError(f"{fn}: parameter {i}'s exp_avg has {s['exp_avg'].numel()} elements, the "
                                     f"parameter {p.numel()}; pass the state of the same parameters")
                step = int(s["step"])
                new = new_state(p, g["m_codec"], g["v_codec"], g["master"])
                m = encode_moment(s["exp_avg"], g["m_codec"], 1, int(g["seed"]), step)
                v = encode_moment(s["exp_avg_sq"], g["v_codec"], 2, int(g["seed"]), step)
                new.update(m_codes=m[0].to(p.device), m_meta=m[1].to(p.device), v_codes=v[0].to(p.device),
                           v_meta=v[1].to(p.device))
                new.update(step=step, element_offset=offsets[p], m_codec=g["m_codec"], v_codec=g["v_codec"],
                           master=g["master"])
                state[i] = new
        return {"state": state, "param_groups": out_groups}

    def _refuse_dtensors(self, fn):
        dtensor = _dtensor_class()
        if dtensor is not None and any(isinstance(p, dtensor) for g in self.param_groups for p in g["params"]):
            raise ValueError(f"{fn}: the parameters are sharded (DTensor); exchanging state with torch.optim.AdamW "
                             "is for whole parameters: save and load sharded state with torch.distributed.checkpoint")

    def torch_state_dict(self) -> Dict[str, Any]:
        """This optimizer's state as torch.optim.AdamW's state_dict() has it (float32 exp_avg and
        exp_avg_sq decoded from the codecs, float step tensors): torch.optim.AdamW.load_state_dict
        takes it. Compensation buffers (bf16_kahan) have no place there and are dropped."""
        self._refuse_dtensors("octet.torch.AdamW.torch_state_dict")
        sd = self.state_dict()
        state = {}
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        for g in self.param_groups:
            for p in g["params"]:
                s = self.state.get(p)
                if not s:
                    continue
                shape = p.shape
                state[index[id(p)]] = {
                    "step": torch.tensor(float(s["step"])),
                    "exp_avg": decode_moment(s["m_codes"], s["m_meta"], s["m_codec"], 1).reshape(shape).to(p.device),
                    "exp_avg_sq": decode_moment(s["v_codes"], s["v_meta"], s["v_codec"], 2).reshape(shape).to(p.device),
                }
        groups = []
        for g, saved in zip(self.param_groups, sd["param_groups"]):
            groups.append(dict(lr=g["lr"], betas=tuple(g["betas"]), eps=g["eps"], weight_decay=g["weight_decay"],
                               amsgrad=False, maximize=False, foreach=None, capturable=False, differentiable=False,
                               fused=None, params=list(saved["params"])))
        return {"state": state, "param_groups": groups}


def _is_torch_adamw_state(sd: Dict[str, Any]) -> bool:
    return any(isinstance(s, dict) and "exp_avg" in s for s in sd.get("state", {}).values())
