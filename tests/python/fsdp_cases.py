"""The worker side of test_fsdp.py: functions run in each of `world` spawned processes (gloo on the
CPU). Not collected by pytest (no test_ prefix)."""

import datetime
import os

import torch
import torch.distributed as dist

import worker_exit

import octet.torch as ot

# (shape, how octet's AdamW steps its shards under FSDP2): rows of 256 or 512 elements step in place,
# by rows (one of 10 rows over 4 ranks: uneven; 3 rows over 4: one rank holds none); rows of 100 and
# of 1 element (a bias) are gathered whole.
SHAPES = ((10, 256), (64, 512), (3, 256), (256, 100), (37,))
STEPS = 3
# (moment codec, master policy): every codec over float32 masters, two codecs over each bf16 master.
CASES = tuple((c, "fp32") for c in ot.optim.CODECS) + tuple(
    (c, m) for m in ("bf16_stochastic", "bf16_kahan", "bf16_nearest") for c in ("e4m3_expanded", "dynamic8"))


def init(rank, world, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # a hang fails the test instead
    torch.manual_seed(0)


def finish():
    """A worker's end, its results written: the process group destroyed, then worker_exit.leave()."""
    dist.destroy_process_group()
    worker_exit.leave()


def full_params(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).mul_(0.1).to(dtype) for s in SHAPES]


def full_grads(seed, step, nan_step=None):
    """The whole gradients of a step (the same on every rank); at nan_step one element is NaN."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    grads = [torch.randn(s, generator=g).mul_(1e-2 * (1 + step)) for s in SHAPES]
    if step == nan_step:
        grads[1][40, 7] = float("nan")
    return grads


class Params(torch.nn.Module):
    def __init__(self, tensors):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for t in tensors])


def optimizer_args(codec, master):
    return dict(lr=1e-2, m_codec=codec, master=master, seed=7, weight_decay=0.1)


def single_process(codec, master, steps, nan_step=None, seed=1):
    """The reference: one process stepping the whole parameters."""
    dtype = torch.float32 if master == "fp32" else torch.bfloat16
    model = Params(full_params(seed, dtype))
    opt = ot.AdamW(model.parameters(), **optimizer_args(codec, master))
    for step in steps:
        for p, g in zip(model.p, full_grads(seed, step, nan_step)):
            p.grad = g.to(p.dtype)
        opt.step()
    return [p.detach().clone() for p in model.p], opt


def _sharded_model(world, codec, master, seed):
    from torch.distributed.fsdp import fully_shard

    dtype = torch.float32 if master == "fp32" else torch.bfloat16
    model = Params(full_params(seed, dtype))
    fully_shard(model)
    return model, ot.AdamW(model.parameters(), **optimizer_args(codec, master))


def _steps(model, opt, steps, nan_step, seed):
    from torch.distributed.tensor import distribute_tensor

    skipped = []
    for step in steps:
        for p, g in zip(model.p, full_grads(seed, step, nan_step)):
            p.grad = distribute_tensor(g.to(p.dtype), p.device_mesh, p.placements)
        opt.step()
        skipped.append(opt.report["skipped"])
    return skipped


def _gather_state(opt, model):
    """Every parameter's state, whole (DTensors gathered), as plain CPU tensors."""
    from torch.distributed.tensor import DTensor

    out = []
    for p in model.p:
        s = opt.state[p]
        out.append({k: (v.full_tensor() if isinstance(v, DTensor) else v).reshape(-1).clone()
                    for k, v in s.items() if isinstance(v, torch.Tensor)})
    return out


def _write(out_dir, name, model, opt, extra):
    """Each rank writes its gathered parameters and state (every rank must hold the same)."""
    params = [p.full_tensor().clone() for p in model.p]
    torch.save({"params": params, "state": _gather_state(opt, model), **extra},
               os.path.join(out_dir, f"{name}.rank{dist.get_rank()}.pt"))


def train(rank, world, init_file, out_dir, nan_step):
    """For each of CASES, STEPS steps under FSDP2 with the same whole gradients as single_process;
    then what is refused: a DTensor parameter given a plain gradient, torch_state_dict of shards."""
    from torch.distributed.tensor import DTensor

    init(rank, world, init_file)
    for codec, master in CASES:
        model, opt = _sharded_model(world, codec, master, 1)
        skipped = _steps(model, opt, range(STEPS), nan_step, 1)
        _write(out_dir, f"train.{codec}.{master}", model, opt, {"skipped": skipped})
    model, opt = _sharded_model(world, "e4m3_expanded", "fp32", 1)
    model.p[0].grad = torch.zeros(model.p[0].shape)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh2d = init_device_mesh("cpu", (2, world // 2))  # HSDP's shape: not stepped by this build
    p2d = torch.nn.Parameter(distribute_tensor(torch.ones(8, 256), mesh2d, [Shard(0), Shard(0)]))
    p2d.grad = distribute_tensor(torch.ones(8, 256), mesh2d, [Shard(0), Shard(0)])
    opt2d = ot.AdamW([p2d])
    refused = []
    for call, error in ((opt.step, TypeError), (opt.torch_state_dict, ValueError), (opt2d.step, ValueError)):
        try:
            call()
            refused.append("no error")
        except error as e:
            refused.append(str(e))
    assert isinstance(model.p[0], DTensor)
    torch.save(refused, os.path.join(out_dir, f"refused.rank{rank}.pt"))
    finish()


# (moment codec, master policy) of the checkpoint tests
RESHARD_CASES = (("e4m3_expanded", "bf16_stochastic"), ("dynamic8", "bf16_kahan"), ("e4m3_scaled", "fp32"))


def save(rank, world, init_file, out_dir):
    """For each of RESHARD_CASES, STEPS steps, then a torch.distributed.checkpoint of the model and
    the optimizer (octet's save_checkpoint: with the CRC-32s of its rows); for the first case also
    each rank's own optimizer state_dict() (torch.save), which another world size must refuse."""
    from octet.torch.fsdp import save_checkpoint

    init(rank, world, init_file)
    for codec, master in RESHARD_CASES:
        model, opt = _sharded_model(world, codec, master, 1)
        _steps(model, opt, range(STEPS), None, 1)
        save_checkpoint(model, opt, os.path.join(out_dir, f"checkpoint.{codec}.{master}"))
        if (codec, master) == RESHARD_CASES[0]:
            torch.save(opt.state_dict(), os.path.join(out_dir, f"optim.rank{rank}.pt"))
    finish()


def resume(rank, world, init_file, out_dir, name, staged):
    """Loads each checkpoint on this world size and steps STEPS more: torch's own dcp.load into the
    live state dicts, or (staged) octet's load_checkpoint. Then what loading the per-rank state_dict()
    saved on 2 ranks answers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    from octet.torch.fsdp import load_checkpoint

    init(rank, world, init_file)
    for codec, master in RESHARD_CASES:
        model, opt = _sharded_model(world, codec, master, 2)  # other weights: the checkpoint must replace them
        checkpoint = os.path.join(out_dir, f"checkpoint.{codec}.{master}")
        if staged:
            load_checkpoint(model, opt, checkpoint)
        else:
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
            dcp.load(state, checkpoint_id=checkpoint)
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, opt, state["optim"])
        loaded = {"loaded_params": [p.full_tensor().clone() for p in model.p],
                  "loaded_state": _gather_state(opt, model)}
        _steps(model, opt, range(STEPS, 2 * STEPS), None, 1)
        if (codec, master) == RESHARD_CASES[0]:
            before = _gather_state(opt, model)
            try:
                opt.load_state_dict(torch.load(os.path.join(out_dir, f"optim.rank{rank % 2}.pt"), weights_only=False))
                loaded["per_rank_state"] = "no error"
            except ValueError as e:
                loaded["per_rank_state"] = str(e)
            loaded["per_rank_unchanged"] = _same_states(before, _gather_state(opt, model))
        _write(out_dir, f"{name}.{codec}.{master}", model, opt, loaded)
    finish()


def _same_states(a, b):
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def _flip_byte(checkpoint, key, rows_from, out, header=False):
    """A copy of a checkpoint directory (out) in which one byte of the stored values of tensor `key`,
    in the chunk whose rows start at rows_from, is flipped (header: the first byte of the chunk's
    record, where torch.load reads its format); returns that chunk's file."""
    import shutil

    import torch.distributed.checkpoint as dcp

    shutil.copytree(checkpoint, out)
    metadata = dcp.FileSystemReader(checkpoint).read_metadata()
    index, info = next((i, v) for i, v in metadata.storage_data.items()
                       if i.fqn == key and i.offset[0] == rows_from)
    path = os.path.join(out, info.relative_path)
    raw = bytearray(open(path, "rb").read())
    item = bytes(raw[info.offset:info.offset + info.length])
    import io

    values = torch.load(io.BytesIO(item), weights_only=True)  # the tensor this item holds, to find its bytes
    data = values.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
    at = item.find(data)
    assert at >= 0, key
    raw[info.offset if header else info.offset + at + len(data) // 2] ^= 0x40
    open(path, "wb").write(raw)
    return info.relative_path


def bad_checkpoints(rank, world, init_file, out_dir):
    """What bad input answers, on 2 ranks: checkpoints (octet's save_checkpoint) with one byte flipped
    in the stored optimizer state (an 8-bit moment: in its values, or in its record's header) or in a
    weight, with a shard file cut short, read
    by load_checkpoint into a model and optimizer that have trained (each must be left as it was);
    the corrupted moment read by torch's own dcp.load and set_optimizer_state_dict; another rank's
    state_dict(); and an FP8 all-gather of a weight that FSDP2 shards along dim 1."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from octet.torch.fsdp import load_checkpoint, save_checkpoint

    init(rank, world, init_file)
    codec, master = "dynamic8", "bf16_kahan"
    model, opt = _sharded_model(world, codec, master, 1)
    _steps(model, opt, range(STEPS), None, 1)
    good = os.path.join(out_dir, "bad.good")
    save_checkpoint(model, opt, good)
    torch.save(opt.state_dict(), os.path.join(out_dir, f"bad.optim.rank{rank}.pt"))
    files = {}
    if rank == 0:
        # rank 1's rows of the second parameter's v codes (64 rows of 512: rows 32..63), and a weight
        files["moment"] = _flip_byte(good, "optim.state.p.1.v_codes", 32, os.path.join(out_dir, "bad.moment"))
        files["weight"] = _flip_byte(good, "model.p.0", 0, os.path.join(out_dir, "bad.weight"))
        _flip_byte(good, "optim.state.p.1.v_codes", 32, os.path.join(out_dir, "bad.header"), header=True)
        import shutil

        shutil.copytree(good, os.path.join(out_dir, "bad.cut"))
        cut = os.path.join(out_dir, "bad.cut", "__1_0.distcp")
        raw = open(cut, "rb").read()
        open(cut, "wb").write(raw[:len(raw) // 2])
    dist.barrier()
    target, target_opt = _sharded_model(world, codec, master, 2)
    _steps(target, target_opt, range(1), None, 2)
    before = ([p.full_tensor().clone() for p in target.p], _gather_state(target_opt, target))
    result = {"files": files}
    for name in ("moment", "weight", "header", "cut"):
        try:
            load_checkpoint(target, target_opt, os.path.join(out_dir, f"bad.{name}"))
            result[name] = "no error"
        except ValueError as e:
            result[name] = str(e)
        params, state = [p.full_tensor().clone() for p in target.p], _gather_state(target_opt, target)
        result[f"{name}_unchanged"] = (all(torch.equal(a, b) for a, b in zip(params, before[0]))
                                       and _same_states(state, before[1]))
    load_checkpoint(target, target_opt, good)  # the sound checkpoint loads
    result["good_loaded"] = _same_states(_gather_state(target_opt, target), _gather_state(opt, model)) and all(
        torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(target.p, model.p))
    # torch's own path: dcp.load writes into the tensors it is given (the model's live parameters;
    # copies of the optimizer's state), then octet's load_state_dict checks before it assigns
    plain, plain_opt = _sharded_model(world, codec, master, 2)
    _steps(plain, plain_opt, range(1), None, 2)
    plain_before = ([p.full_tensor().clone() for p in plain.p], _gather_state(plain_opt, plain))
    state = {"model": get_model_state_dict(plain), "optim": get_optimizer_state_dict(plain, plain_opt)}
    dcp.load(state, checkpoint_id=os.path.join(out_dir, "bad.moment"))
    after_load = ([p.full_tensor().clone() for p in plain.p], _gather_state(plain_opt, plain))
    try:
        set_optimizer_state_dict(plain, plain_opt, state["optim"])
        result["plain_dcp"] = "no error"
    except ValueError as e:
        result["plain_dcp"] = str(e)
    params, plain_state = [p.full_tensor().clone() for p in plain.p], _gather_state(plain_opt, plain)
    same = lambda xs, ys: all(torch.equal(a, b) for a, b in zip(xs, ys))  # noqa: E731
    # what the plain path leaves: the optimizer as it was (after dcp.load and after the refusal); the
    # model's parameters those of the checkpoint (the trained `model`'s), written by dcp.load
    result["plain_optimizer_unchanged"] = (_same_states(after_load[1], plain_before[1])
                                           and _same_states(plain_state, plain_before[1]))
    result["plain_model_was_changed"] = not same(after_load[0], plain_before[0])
    result["plain_model_is_checkpoints"] = same(params, [p.full_tensor() for p in model.p])
    # another rank's state_dict() (the same world size: rows of the same count, at other places)
    before = _gather_state(target_opt, target)
    try:
        target_opt.load_state_dict(torch.load(os.path.join(out_dir, f"bad.optim.rank{1 - rank}.pt"),
                                              weights_only=False))
        result["other_rank"] = "no error"
    except ValueError as e:
        result["other_rank"] = str(e)
    result["other_rank_unchanged"] = _same_states(before, _gather_state(target_opt, target))
    # FP8 all-gather of a weight sharded along dim 1 (fully_shard's shard_placement_fn)
    torch.manual_seed(5)
    fp8 = torch.nn.Sequential(ot.Float8Linear(64, 64, recipe="tensorwise"))
    ot.enable_fp8_all_gather(fp8)
    fully_shard(fp8, shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 else Shard(0))
    try:
        fp8(torch.randn(4, 64))
        result["dim1"] = "no error"
    except ValueError as e:
        result["dim1"] = str(e)
    torch.save(result, os.path.join(out_dir, f"bad.rank{rank}.pt"))
    finish()


def mlp():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))


def batch(step, size=8):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(size, 256, generator=g), torch.randn(size, 256, generator=g)


def reduce_scatter_bounds(rank, world, init_file, out_dir, steps):
    """CompressedReduceScatter called directly: each rank's input is its own random draw; every rank
    writes its inputs and outputs (the test computes the exact sums). With feedback, the state after
    step 3 is saved and loaded into a fresh reduce-scatter that replays the later steps; a corrupted
    copy and one from another world size are refused."""
    from octet.torch.distributed import CodecConfig, CompressedReduceScatter

    init(rank, world, init_file)
    shard = 1000  # not a multiple of the Hadamard block or of 128
    out = {}
    for feedback in (None, "f32", "e4m3"):
        comm = CompressedReduceScatter(CodecConfig(format="e4m3", block=256), feedback=feedback)
        g = torch.Generator().manual_seed(10 * rank + 1)
        inputs, outputs, residual_norms = [], [], []
        for step in range(steps):
            x = torch.randn(world * shard, generator=g) * (1 + 1e-3 * step)
            x[:shard // 10] = 0  # zero rows (padding): their codes must decode to 0 plus feedback only
            y = torch.empty(shard)
            comm(y, x.clone(), dist.group.WORLD, dist.ReduceOp.SUM)
            inputs.append(x)
            outputs.append(y)
            residual_norms.append([float(ot.distributed.residual_values(comm.residuals[r], shard).norm())
                                   for r in sorted(comm.residuals)] if feedback else [])
            if step == 2:
                saved = comm.state_dict()
        final = {r: ot.distributed.residual_values(e, shard).clone() for r, e in (comm.residuals or {}).items()}
        out[feedback] = {"inputs": inputs, "outputs": outputs, "residual_norms": residual_norms,
                         "final_residuals": final, "bytes_sent": comm.bytes_sent}
        if feedback:
            out[feedback]["resume"] = _resume_reduce_scatter(feedback, saved, inputs, outputs, shard, world)
    torch.save(out, os.path.join(out_dir, f"rs.rank{rank}.pt"))
    finish()


def _resume_reduce_scatter(feedback, saved, inputs, outputs, shard, world):
    """Replays steps 3.. from the state saved after step 2 (bit for bit?), and what loading a corrupted
    state and one saved on another world size answer."""
    from octet.torch.distributed import CodecConfig, CompressedReduceScatter

    make = lambda: CompressedReduceScatter(CodecConfig(format="e4m3", block=256), feedback=feedback)  # noqa: E731
    resumed = make()
    resumed.load_state_dict(torch.load(_roundtrip(saved), weights_only=True))
    same = True
    for step in range(3, len(inputs)):
        y = torch.empty(shard)
        resumed(y, inputs[step].clone(), dist.group.WORLD, dist.ReduceOp.SUM)
        same = same and torch.equal(y, outputs[step])
    result = {"bit_identical": same}
    bad = {**saved, "residuals": {r: e.clone() for r, e in saved["residuals"].items()}}
    peer = min(bad["residuals"])
    bad["residuals"][peer].view(torch.uint8)[5] ^= 1
    fresh = make()
    try:
        fresh.load_state_dict(bad)
        result["corrupted"] = "no error"
    except ValueError as e:
        result["corrupted"] = str(e)
    result["nothing_loaded"] = fresh.residuals is None and fresh.step == 0
    other = make()
    other.load_state_dict({**saved, "world": world + 1})
    try:
        other(torch.empty(shard), inputs[3].clone(), dist.group.WORLD, dist.ReduceOp.SUM)
        result["other_world"] = "no error"
    except ValueError as e:
        result["other_world"] = str(e)
    return result


def _roundtrip(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def fsdp_training(rank, world, init_file, out_dir, steps):
    """A model trained by backward under FSDP2 with octet's AdamW (each rank its slice of every
    batch, FSDP2 averaging the gradients): once with torch's reduce-scatter and once through octet's
    codec with error feedback; losses (averaged over the ranks), parameters and the bytes each rank
    sent per step."""
    from torch.distributed.fsdp import fully_shard

    from octet.torch.distributed import CodecConfig, compress_reduce_scatter

    init(rank, world, init_file)
    result = {}
    for compressed in (False, True):
        model = mlp()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        comms = compress_reduce_scatter(model, CodecConfig(format="e4m3")) if compressed else {}
        opt = ot.AdamW(model.parameters(), lr=1e-3, m_codec="fp32", master="fp32")
        losses, sent = [], []
        for step in range(steps):
            x, y = batch(step, 16)
            per = x.shape[0] // world
            loss = torch.nn.functional.mse_loss(model(x[rank * per:(rank + 1) * per]),
                                                y[rank * per:(rank + 1) * per])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
            sent.append(sum(c.bytes_sent for c in comms.values()))
        losses = torch.stack(losses)
        dist.all_reduce(losses)
        result[compressed] = {"losses": (losses / world).tolist(), "bytes_sent": sent,
                              "params": [p.full_tensor().clone() for p in model.parameters()],
                              "elements": sum(p.numel() for p in model.parameters())}
    torch.save(result, os.path.join(out_dir, f"fsdp_training.rank{rank}.pt"))
    finish()


def fp8_model():
    """Layers that FSDP2 all-gathers in FP8 over 2 ranks: two tensorwise ones (the second's 201 rows
    shard unevenly) and a blockwise one (256 rows: 128 per rank, whole 128 x 128 blocks; 201 columns:
    a partial block); and two it gathers in float: a blockwise one whose 100 rows put 50 on a rank
    (blocks would straddle ranks) and an mxfp8 one; last, a tensorwise_delayed one gathered in FP8
    (its first step on the whole weight's amax, the next ones on its amax history), and an mxfp8 one
    gathered in FP8 (32 rows per rank, 128 columns)."""
    torch.manual_seed(4)
    return torch.nn.Sequential(ot.Float8Linear(256, 512, recipe="tensorwise"), torch.nn.GELU(),
                               ot.Float8Linear(512, 201, recipe="tensorwise"), torch.nn.GELU(),
                               ot.Float8Linear(201, 256, recipe="blockwise"), torch.nn.GELU(),
                               ot.Float8Linear(256, 100, recipe="blockwise"), torch.nn.GELU(),
                               ot.Float8Linear(100, 64, recipe="mxfp8"), torch.nn.GELU(),
                               ot.Float8Linear(64, 128, recipe="tensorwise_delayed"), torch.nn.GELU(),
                               ot.Float8Linear(128, 64, recipe="mxfp8"))


def fp8_all_gather(rank, world, init_file, out_dir, steps):
    """fp8_model under FSDP2 three ways (weights gathered in FP8, in float32, in bfloat16 by FSDP2's
    mixed precision; FP8 also with only the root sharded, whose weights FSDP2 does not gather again
    for the backward: MXFP8's forward all-gather then carries both copies), with the bytes every
    all-gather moved; the FP8 run's parameters after every
    step, and what enable_fp8_all_gather and bad calls answer."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    init(rank, world, init_file)
    moved = []
    # FSDP2's all-gather (DefaultAllGather) calls dist.all_gather_single; count what it gathers
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    real_all_gather = getattr(dist, name)

    def counting_all_gather(output, input, *args, **kwargs):
        moved.append(output.numel() * output.element_size())
        return real_all_gather(output, input, *args, **kwargs)

    setattr(dist, name, counting_all_gather)
    result = {}
    for run in ("fp8", "fp8_precomputed", "fp8_root", "float32", "bf16"):
        model = fp8_model()
        if run.startswith("fp8"):
            result["report"] = ot.enable_fp8_all_gather(model)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if run == "bf16" else MixedPrecisionPolicy()
        for layer in model:
            if isinstance(layer, ot.Float8Linear) and run != "fp8_root":
                fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", master="fp32")
        params, per_step = [], []
        for step in range(steps):
            x, _ = batch(step, 16)
            moved.clear()
            loss = model(x).square().mean()
            per_step.append(sum(moved))  # the forward's all-gathers
            loss.backward()
            opt.step()
            opt.zero_grad()
            if run == "fp8_precomputed":
                ot.precompute_fp8_scales(model)
            params.append([p.full_tensor().clone() for p in model.parameters()])
        result[run] = {"params": params, "forward_bytes": per_step}
        if run == "fp8":  # with the CRC-32s and the layers' amax histories (linear_state)
            from octet.torch.fsdp import save_checkpoint

            save_checkpoint(model, opt, os.path.join(out_dir, "fp8_checkpoint"))
    setattr(dist, name, real_all_gather)
    model = fp8_model()
    ot.enable_fp8_all_gather(model)
    fully_shard(model)
    try:
        ot.enable_fp8_all_gather(model)
        result["late"] = "no error"
    except ValueError as e:
        result["late"] = str(e)
    torch.save(result, os.path.join(out_dir, f"fp8_all_gather.rank{rank}.pt"))
    finish()


def fp8_resume(rank, world, init_file, out_dir, staged=False):
    """Loads fp8_all_gather's checkpoint (saved on 2 processes) on this world size, model and
    optimizer (staged: with octet.torch.fsdp.load_checkpoint, which also restores the layers' amax
    histories; torch's dcp.load does not), and steps once more with the weights
    still gathered in FP8 (on one process FSDP2 gathers nothing: the layers quantize the weights)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    from torch.distributed.fsdp import fully_shard

    init(rank, world, init_file)
    model = fp8_model()
    ot.enable_fp8_all_gather(model)
    for layer in model:
        if isinstance(layer, ot.Float8Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", master="fp32")
    if staged:
        from octet.torch.fsdp import load_checkpoint

        load_checkpoint(model, opt, os.path.join(out_dir, "fp8_checkpoint"))
    else:
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(state, checkpoint_id=os.path.join(out_dir, "fp8_checkpoint"))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
    loaded = [p.full_tensor().clone() for p in model.parameters()]
    x, _ = batch(10, 16)
    model(x).square().mean().backward()
    opt.step()
    kinds = [type(layer.weight.to_local()).__name__ for layer in model if isinstance(layer, ot.Float8Linear)]
    torch.save({"loaded": loaded, "kinds": kinds, "after": [p.full_tensor().clone() for p in model.parameters()]},
               os.path.join(out_dir, f"fp8_resume.{world}.rank{rank}.pt"))
    finish()


# ---- NVFP4 all-gather ----

NV_TOKENS = 13  # not a multiple of 16: the Hadamard rotation of X and dY pads the tokens


def nv_model():
    """nvfp4 layers: A's 128 rows shard evenly on 2 and 4 ranks (64, 32 a rank); B's 63 rows
    unevenly (32 + 31 on 2, 16 + 16 + 16 + 15 on 4), with 128 columns; C's 96 rows evenly on 2 (48 a
    rank) with 63 columns (a partial block, an odd byte), and on 4 ranks 24 a rank, not a multiple of
    16: gathered in float."""
    torch.manual_seed(6)
    return torch.nn.Sequential(ot.Float8Linear(64, 128, recipe="nvfp4", seed=11), torch.nn.GELU(),
                               ot.Float8Linear(128, 63, recipe="nvfp4", seed=12), torch.nn.GELU(),
                               ot.Float8Linear(63, 96, recipe="nvfp4", seed=13))


def nv_batch(step):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(NV_TOKENS, 64, generator=g)


def _raw_copy(q):
    return None if q is None else [t.clone() for t in q.raw()]


def nvfp4_all_gather(rank, world, init_file, out_dir, steps):
    """nv_model under FSDP2, every rank on the whole batch: weights gathered as NVFP4 with every layer
    sharded (row-wise copy in the forward's all-gather, column-wise in the backward's), with only the
    root sharded (both in the forward's), and in float32 and bfloat16; per step Y, dX, the whole
    weights before the step, the copies the layers multiplied, the bytes all-gathered in the forward
    and the backward, and the parameters after the step."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from octet.torch import fsdp

    init(rank, world, init_file)
    moved = []
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    real_all_gather = getattr(dist, name)

    def counting_all_gather(output, input, *args, **kwargs):
        moved.append(output.numel() * output.element_size())
        return real_all_gather(output, input, *args, **kwargs)

    setattr(dist, name, counting_all_gather)
    captured = []
    real_copies = fsdp.Float8GatheredWeight.copies

    def recording_copies(self):
        wq, wt = real_copies(self)
        captured.append((tuple(self.shape), _raw_copy(wq), _raw_copy(wt)))
        return wq, wt

    fsdp.Float8GatheredWeight.copies = recording_copies
    result = {}
    for run in ("nvfp4", "nvfp4_root", "float32", "bf16"):
        model = nv_model()
        if run.startswith("nvfp4"):
            result["report"] = ot.enable_fp8_all_gather(model)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if run == "bf16" else MixedPrecisionPolicy()
        for layer in model:
            if isinstance(layer, ot.Float8Linear) and run != "nvfp4_root":
                fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", master="fp32")
        per_step = []
        for step in range(steps):
            weights = [layer.weight.full_tensor().clone() for layer in model if isinstance(layer, ot.Float8Linear)]
            x = nv_batch(step).requires_grad_()
            moved.clear()
            captured.clear()
            y = model(x)
            forward_bytes = sum(moved)
            moved.clear()
            y.square().mean().backward()
            backward_bytes = sum(moved)
            opt.step()
            opt.zero_grad()
            if run == "nvfp4" and step == 1:
                ot.precompute_fp8_scales(model)  # step 2's amaxes from the one all-reduce
            per_step.append({"y": y.detach().clone(), "dx": x.grad.clone(), "weights": weights,
                             "copies": list(captured), "forward_bytes": forward_bytes,
                             "backward_bytes": backward_bytes,
                             "params": [p.full_tensor().clone() for p in model.parameters()],
                             "philox": [layer.philox.clone() for layer in model if isinstance(layer, ot.Float8Linear)]})
        result[run] = per_step
    setattr(dist, name, real_all_gather)
    fsdp.Float8GatheredWeight.copies = real_copies
    torch.save(result, os.path.join(out_dir, f"nvfp4.{world}.rank{rank}.pt"))
    finish()
