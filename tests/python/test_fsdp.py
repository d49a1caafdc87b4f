"""octet's AdamW on FSDP2's sharded parameters (DTensor), on the CPU with gloo: 2 and 4 processes.

Oracles: one process stepping the whole parameters with the same gradients (bit for bit: a shard's
state is the slice of the whole parameter's state, whatever the number of ranks), the same run
resumed from a torch.distributed.checkpoint on another world size (bit for bit), and one process
training on the whole batch (within float32 rounding: FSDP2 sums the ranks' gradients in another
order). Bad input (corrupted or cut-short checkpoints, another rank's or world size's optimizer
state, an FP8 all-gather along dim 1) must raise an error naming it on every rank and change nothing.
The worker functions are in fsdp_cases.py.
"""

import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this torch build")

import fsdp_cases as cases  # noqa: E402

import octet.torch as ot  # noqa: E402


def spawn(fn, world, tmp_path, *args):
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(world, str(tmp_path / f"init.{fn.__name__}.{world}"), str(tmp_path), *args), nprocs=world,
             join=True)


def load(tmp_path, name):
    return torch.load(os.path.join(tmp_path, name))


def test_sharded_steps_match_one_process_bit_for_bit(tmp_path):
    world = 4  # uneven shards, and a rank without rows (2 ranks: the checkpoint test)
    nan_step = 1  # step 1's gradients hold a NaN on one rank's shard: every rank skips that step
    spawn(cases.train, world, tmp_path, nan_step)
    for codec, master in cases.CASES:
        params, opt = cases.single_process(codec, master, range(cases.STEPS), nan_step=nan_step)
        states = [opt.state[p] for p in opt.param_groups[0]["params"]]
        for rank in range(world):
            got = load(tmp_path, f"train.{codec}.{master}.rank{rank}.pt")
            assert got["skipped"] == [0, 1, 0], (codec, master, rank)
            for i, (a, b) in enumerate(zip(got["params"], params)):
                assert torch.equal(a, b), f"{codec}/{master}: parameter {i} {tuple(b.shape)} differs on rank {rank}"
            for i, (a, b) in enumerate(zip(got["state"], states)):
                for k, v in a.items():
                    assert torch.equal(v, b[k].reshape(-1)), f"{codec}/{master}: {k} of parameter {i}, rank {rank}"
    for rank in range(world):
        step, torch_state, mesh2d = load(tmp_path, f"refused.rank{rank}.pt")
        assert "DTensor gradient" in step, step
        assert "torch.distributed.checkpoint" in torch_state, torch_state
        assert "2-D device mesh" in mesh2d, mesh2d


def test_checkpoint_saved_on_2_resumes_on_4_and_1_bit_identically(tmp_path):
    spawn(cases.save, 2, tmp_path)
    spawn(cases.resume, 2, tmp_path, "on2", False)  # torch's dcp.load into the live state dicts
    spawn(cases.resume, 4, tmp_path, "on4", True)  # octet.torch.fsdp.load_checkpoint (staged, checked)
    spawn(cases.resume, 1, tmp_path, "on1", True)
    for codec, master in cases.RESHARD_CASES:
        saved_params, saved_opt = cases.single_process(codec, master, range(cases.STEPS))
        params, _ = cases.single_process(codec, master, range(2 * cases.STEPS))
        on2 = load(tmp_path, f"on2.{codec}.{master}.rank0.pt")
        for world, name in ((2, "on2"), (4, "on4"), (1, "on1")):
            for rank in range(world):
                got = load(tmp_path, f"{name}.{codec}.{master}.rank{rank}.pt")
                if (codec, master) == cases.RESHARD_CASES[0]:
                    # a rank's own state_dict() (torch.save) is its rows: it loads on the same world
                    # size and is refused, naming both sizes, on another, with nothing loaded
                    refusal = got["per_rank_state"]
                    if world == 2:
                        assert refusal == "no error", refusal
                    else:
                        assert "parameter 0 (10, 256)'s m_codes" in refusal, refusal
                        assert "saved sharded over 2 ranks" in refusal and f"sharded over {world} (rank" in refusal
                        assert got["per_rank_unchanged"], (world, rank)
                for i, (a, b) in enumerate(zip(got["loaded_params"], saved_params)):
                    assert torch.equal(a, b), f"{codec}/{master}: loaded parameter {i} on {world} ranks"
                for a, b in zip(got["loaded_state"], on2["loaded_state"]):
                    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (codec, master, world)
                for i, (a, b, c) in enumerate(zip(got["params"], on2["params"], params)):
                    assert torch.equal(a, b), f"{codec}/{master}: parameter {i} after resuming on {world} ranks"
                    assert torch.equal(a, c), f"{codec}/{master}: parameter {i} against the uninterrupted run"


def test_compressed_reduce_scatter_bounds(tmp_path):
    from octet.torch.distributed import CodecConfig, encoded_size, error_bound

    world, steps, shard = 4, 6, 1000
    spawn(cases.reduce_scatter_bounds, world, tmp_path, steps)
    runs = [load(tmp_path, f"rs.rank{r}.pt") for r in range(world)]
    config = CodecConfig(format="e4m3", block=256)
    rel, ab = error_bound(shard, config)
    chunk = lambda x, r: x[r * shard:(r + 1) * shard].double()  # noqa: E731
    for me in range(world):
        mine = {fb: runs[me][fb] for fb in runs[me]}
        assert mine[None]["bytes_sent"] == (world - 1) * encoded_size(shard, config)
        for t in range(steps):
            exact = sum(chunk(runs[r][None]["inputs"][t], me) for r in range(world))
            err = (mine[None]["outputs"][t].double() - exact).norm()
            bound = sum(rel * chunk(runs[r][None]["inputs"][t], me).norm() + ab for r in range(world) if r != me)
            assert err <= bound, (me, t, float(err), float(bound))
        for fb in ("f32", "e4m3"):
            # Error feedback telescopes: over the steps, what rank me received lacks exactly what the
            # senders' residuals for its chunk hold now (float32 sums aside).
            total_exact = sum(chunk(runs[r][fb]["inputs"][t], me) for r in range(world) for t in range(steps))
            total_out = sum(mine[fb]["outputs"][t].double() for t in range(steps))
            held = sum(runs[r][fb]["final_residuals"][me].double() for r in range(world) if r != me)
            gap = (total_out + held - total_exact).norm() / total_exact.norm()
            assert gap < (1e-5 if fb == "f32" else 0.1 * rel), (fb, me, float(gap))
            for r in range(world):
                if r == me:
                    continue
                norms = runs[r][fb]["residual_norms"]
                peer = sorted(runs[r][fb]["final_residuals"]).index(me)
                for t in range(steps):
                    x = chunk(runs[r][fb]["inputs"][t], me).norm()
                    before = norms[t - 1][peer] if t else 0.0
                    slack = 1.01 if fb == "f32" else 1.3  # the e4m3 residual is itself quantized
                    assert norms[t][peer] <= slack * (rel * (x + before) + ab), (fb, r, me, t)
            # a checkpoint of the reduce-scatter resumes bit for bit; bad ones are refused whole
            resume = mine[fb]["resume"]
            assert resume["bit_identical"], (fb, me)
            assert "destination rank" in resume["corrupted"] and "CRC-32" in resume["corrupted"], resume
            assert resume["nothing_loaded"], resume
            assert f"saved by rank {me} of {world + 1}" in resume["other_world"], resume




def test_bad_checkpoints_are_refused_naming_them_with_nothing_loaded(tmp_path):
    world = 2
    spawn(cases.bad_checkpoints, world, tmp_path)
    runs = [load(tmp_path, f"bad.rank{r}.pt") for r in range(world)]
    files = runs[0]["files"]
    for rank, got in enumerate(runs):
        # one flipped byte in rank 1's rows of an 8-bit moment (the middle byte of rows 32..63 of 512
        # one-byte codes: row 48), in a weight (the middle of rank 0's 5 rows: row 2), and a shard file
        # cut short: every rank raises, naming the tensor, its rows and its file; nothing changed
        moment = got["moment"]
        assert "is corrupted: rank 1: optim.state.p.1.v_codes rows 48..48 of 64" in moment, moment
        assert f"(in {files['moment']})" in moment and "unchanged" in moment, moment
        weight = got["weight"]
        assert "is corrupted: rank 0: model.p.0 rows 2..2 of 10" in weight, weight
        assert f"(in {files['weight']})" in weight, weight
        cut = got["cut"]
        assert "bad.cut': the shard file __1_0.distcp holds" in cut and "unchanged" in cut, cut
        header = got["header"]  # torch.load fails on rank 1's record: every rank raises
        assert "reading checkpoint" in header and "bad.header' failed (" in header and "rank 1: " in header, header
        for name in ("moment", "weight", "header", "cut"):
            assert got[f"{name}_unchanged"], (name, rank)
        assert got["good_loaded"], rank
        # another rank's state_dict(): its rows' CRC-32s start at their global index
        assert "does not match its CRC-32" in got["other_rank"] and "another rank's rows" in got["other_rank"]
        assert got["other_rank_unchanged"], rank
        # an FP8 all-gather along dim 1 is refused on every rank, naming the layer
        assert "layer '0' (recipe tensorwise, weight (64, 64)) is sharded along dim 1" in got["dim1"], got["dim1"]
    # torch's own dcp.load then set_optimizer_state_dict: octet's load_state_dict finds the moment's
    # CRC-32 on rank 1 and raises before it assigns anything. dcp.load wrote into the copies
    # AdamW.state_dict() returns, so the optimizer is as it was on every rank; it also wrote the
    # checkpoint's weights into the model's live parameters (torch's get_model_state_dict returns
    # them; no hook runs before), which the error names: load_checkpoint stages both
    plain = runs[1]["plain_dcp"]
    assert "parameter 'p.1' (64, 512)'s v_codes rows 48..48 (of 64) does not match its CRC-32" in plain, plain
    assert "nothing was loaded into the optimizer" in plain and "model's parameters already hold" in plain, plain
    assert "octet.torch.fsdp.load_checkpoint" in plain, plain
    assert "rank 1 of 2 refused its state (ValueError: octet.torch.AdamW.load_state_dict: parameter 'p.1'" in \
        runs[0]["plain_dcp"] and "nothing was loaded into the optimizer on any rank" in runs[0]["plain_dcp"], runs[0]
    for rank, got in enumerate(runs):
        assert got["plain_optimizer_unchanged"], rank
        assert got["plain_model_was_changed"] and got["plain_model_is_checkpoints"], rank


@pytest.fixture(scope="module")
def fsdp_training(tmp_path_factory):
    """One FSDP2 training on 2 processes, with torch's and with the compressed reduce-scatter."""
    tmp_path = tmp_path_factory.mktemp("fsdp_training")
    steps = 8
    spawn(cases.fsdp_training, 2, tmp_path, steps)
    return steps, [load(tmp_path, f"fsdp_training.rank{r}.pt") for r in range(2)]


def test_training_under_fsdp2_follows_one_process(fsdp_training):
    steps, runs = fsdp_training
    model = cases.mlp()
    opt = ot.AdamW(model.parameters(), lr=1e-3, m_codec="fp32", master="fp32")
    losses = []
    for step in range(steps):
        x, y = cases.batch(step, 16)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    first = runs[0][False]
    for a, b in zip(runs[1][False]["params"], first["params"]):
        assert torch.equal(a, b), "the ranks' parameters differ"
    # FSDP2 sums the two halves' gradients in another order than one backward over the batch. Adam
    # normalizes each update to about lr, so where a gradient is near zero a last-bit difference can
    # move that weight by up to lr a step; everywhere else the runs agree to rounding (measured:
    # median 5e-10, 0.005% of the weights beyond 1e-6, the largest 1.4e-5 with lr = 1e-3).
    for a, p in zip(first["params"], model.parameters()):
        d = (a.detach() - p.detach()).abs().flatten()
        assert float(d.max()) <= 2 * 1e-3, float(d.max())
        assert float((d > 1e-6).float().mean()) < 1e-3, float((d > 1e-6).float().mean())
    assert torch.allclose(torch.tensor(first["losses"]), torch.tensor(losses), rtol=1e-5, atol=0)


def test_fsdp2_training_with_compressed_reduce_scatter(fsdp_training):
    _, runs = fsdp_training
    plain, compressed = runs[0][False], runs[0][True]
    for a, b in zip(runs[1][True]["params"], compressed["params"]):
        assert torch.equal(a, b), "the ranks' parameters differ"
    # each rank sends one E4M3 message per module per step: about a quarter of float32's bytes
    n = compressed["elements"]
    assert all(0 < b < 0.3 * 4 * n / 2 for b in compressed["bytes_sent"]), (compressed["bytes_sent"], n)
    assert compressed["losses"][-1] < compressed["losses"][0]
    gap = max(abs(a - b) / b for a, b in zip(compressed["losses"], plain["losses"]))
    assert gap < 0.02, (compressed["losses"], plain["losses"])


def test_fp8_all_gather_trains_bit_for_bit_as_one_process(tmp_path):
    world, steps = 2, 3
    spawn(cases.fp8_all_gather, world, tmp_path, steps)
    runs = [load(tmp_path, f"fp8_all_gather.rank{r}.pt") for r in range(world)]
    # one process, the same model, data and optimizer: every rank computed the whole batch, so
    # FSDP2's average of the two ranks' gradients is exact, and only the all-gather differs
    model = cases.fp8_model()
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", master="fp32")
    for step in range(steps):
        x, _ = cases.batch(step, 16)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        for run in ("fp8", "fp8_precomputed", "fp8_root", "float32"):
            for rank in range(world):
                got = runs[rank][run]["params"][step]
                for i, (a, p) in enumerate(zip(got, model.parameters())):
                    assert torch.equal(a, p.detach()), f"{run}: parameter {i} after step {step} on rank {rank}"
    report = runs[0]["report"]
    assert report["0"] == report["2"] == report["10"] == "fp8" and report["4"].startswith("fp8 where"), report
    assert report["8"].startswith("fp8 where out_features") and report["12"] == report["8"], report
    assert "before fully_shard" in runs[0]["late"], runs[0]["late"]
    # bytes the forward's all-gathers move: FP8 codes (and blockwise's and MXFP8's block scales) for
    # the five FP8-gathered weights; the other two weights and the biases travel as float32 in every
    # run but bf16's
    fp8, f32, bf16 = (runs[0][r]["forward_bytes"][0] for r in ("fp8", "float32", "bf16"))
    print(f"forward all-gather bytes per rank and step: FP8 {fp8}, bfloat16 {bf16}, float32 {f32}")
    # elements (201 rows padded to 202 over 2 ranks; the mxfp8 layer's row-wise copy only)
    gathered = 256 * 512 + 512 * 202 + 201 * 256 + 64 * 128 + 128 * 64
    float_rest = f32 - 4 * gathered
    assert fp8 > 0 and fp8 - float_rest <= 1.02 * gathered, (fp8, f32)  # a byte per element, and scales
    assert fp8 - float_rest <= 0.55 * (bf16 - float_rest / 2), (fp8, bf16)
    # with only the root sharded, FSDP2 keeps the forward's gathered weights for the backward: the
    # mxfp8 weight's forward all-gather then carries its column-wise copy too (codes and 32 x 1 scales)
    root = runs[0]["fp8_root"]["forward_bytes"][0]
    assert root - fp8 == 64 * 128 + (64 // 32) * 128, (root, fp8)
    # the checkpoint of the FP8 run (saved on 2 processes) loads on 3, its weights still FP8-gathered,
    # and on 1 (octet's load_checkpoint), where the next step is one process's, bit for bit
    spawn(cases.fp8_resume, 3, tmp_path)
    spawn(cases.fp8_resume, 1, tmp_path, True)
    saved = runs[0]["fp8"]["params"][-1]
    x, _ = cases.batch(10, 16)
    model(x).square().mean().backward()
    opt.step()
    for world in (3, 1):
        for rank in range(world):
            got = load(tmp_path, f"fp8_resume.{world}.rank{rank}.pt")
            assert all(torch.equal(a, b) for a, b in zip(got["loaded"], saved)), (world, rank)
            assert got["kinds"] == ["Float8ShardedWeight"] * 7, got["kinds"]
            assert not any(torch.equal(a, b) for a, b in zip(got["after"], saved)), "the step after loading moved"
    for i, (a, p) in enumerate(zip(load(tmp_path, "fp8_resume.1.rank0.pt")["after"], model.parameters())):
        assert torch.equal(a, p.detach()), f"parameter {i} after the step resumed on 1 process"


def _nv_reference(steps):
    """One process: nv_model on the same batches and optimizer, keeping each step's Y, dX and the
    weight copies its layers multiplied (keep_operands)."""
    model = cases.nv_model()
    layers = [m for m in model if isinstance(m, ot.Float8Linear)]
    for m in layers:
        m.keep_operands = True
    opt = ot.AdamW(model.parameters(), lr=1e-2, m_codec="e4m3_expanded", master="fp32")
    out = []
    for step in range(steps):
        x = cases.nv_batch(step).requires_grad_()
        y = model(x)
        y.square().mean().backward()
        copies = {tuple(m.weight.shape): (m.last_operands["w"], m.last_operands["w_t"]) for m in layers}
        opt.step()
        opt.zero_grad()
        out.append({"y": y.detach().clone(), "dx": x.grad.clone(), "copies": copies,
                    "params": [p.detach().clone() for p in model.parameters()]})
    return out


def _same_copy(got, q):
    return got is not None and all(torch.equal(a, b) for a, b in zip(got, q.raw()))


@pytest.mark.parametrize("world", [2, 4])
def test_nvfp4_all_gather_copies_are_one_process_copies_bit_for_bit(tmp_path, world):
    from octet.torch._quant import quantize

    steps = 3
    spawn(cases.nvfp4_all_gather, world, tmp_path, steps)
    runs = [load(tmp_path, f"nvfp4.{world}.rank{r}.pt") for r in range(world)]
    ref = _nv_reference(steps)
    report = runs[0]["report"]
    assert all(v.startswith("nvfp4 where") for v in report.values()) and len(report) == 3, report
    nv_shapes = {(128, 64), (63, 128)} | ({(96, 63)} if world == 2 else set())  # C: 24 rows a rank on 4
    for rank in range(world):
        for run in ("nvfp4", "nvfp4_root"):
            for step in range(steps):
                got = runs[rank][run][step]
                # every copy a layer multiplied is quantize() of the whole weight at that step (the
                # single process's copy: checked against its layer's own below), row-wise in the
                # forward, column-wise in the forward (root) or the backward (every layer sharded)
                seen = {}
                for shape, wq, wt in got["copies"]:
                    w = next(w for w in got["weights"] if tuple(w.shape) == shape)
                    q, qt, _ = quantize(w, "nvfp4", rowwise=True, columnwise=True)
                    if wq is not None:
                        assert _same_copy(wq, q), (run, world, rank, step, shape, "row-wise")
                        seen.setdefault(shape, set()).add("w")
                    if wt is not None:
                        assert _same_copy(wt, qt), (run, world, rank, step, shape, "column-wise")
                        seen.setdefault(shape, set()).add("w_t")
                assert set(seen) == nv_shapes and all(v == {"w", "w_t"} for v in seen.values()), (run, step, seen)
                if world == 2 or step == 0:
                    # Y and dX from the gathered copies are the single process's; on 2 ranks the
                    # gradient average of two equal halves is exact, so the training stays bit for bit
                    # (on 4, a sum of 4 equal gradients may round: only the first step compares)
                    assert torch.equal(got["y"], ref[step]["y"]), (run, world, rank, step)
                    assert torch.equal(got["dx"], ref[step]["dx"]), (run, world, rank, step)
                if world == 2:
                    for i, (a, b) in enumerate(zip(got["params"], ref[step]["params"])):
                        assert torch.equal(a, b), f"{run}: parameter {i} after step {step} on rank {rank}"
                    for shape, (w, w_t) in ref[step]["copies"].items():
                        q, qt, _ = quantize(got["weights"][[(128, 64), (63, 128), (96, 63)].index(shape)], "nvfp4",
                                            rowwise=True, columnwise=True)
                        assert all(torch.equal(a, b) for a, b in zip(q.raw(), w.raw())), (step, shape)
                        assert all(torch.equal(a, b) for a, b in zip(qt.raw(), w_t.raw())), (step, shape)
    # bytes the weights' all-gathers move per step (the whole gathered output), printed: NVFP4 (codes,
    # E4M3 block scales; even shards 0.5625 bytes an element per copy, FSDP2's padded shard shape 1
    # byte a copy on uneven ones) against bfloat16 and float32; the biases travel in float in all runs
    # but bf16's
    steps0 = {r: runs[0][r][0] for r in ("nvfp4", "nvfp4_root", "float32", "bf16")}
    fwd = {r: s["forward_bytes"] for r, s in steps0.items()}
    bwd = {r: s["backward_bytes"] for r, s in steps0.items()}
    print(f"\n{world} ranks, all-gather bytes per step (forward + backward): nvfp4 {fwd['nvfp4']} + {bwd['nvfp4']}, "
          f"nvfp4 root-only {fwd['nvfp4_root']} + {bwd['nvfp4_root']}, bf16 {fwd['bf16']} + {bwd['bf16']}, "
          f"float32 {fwd['float32']} + {bwd['float32']}")
    padded = lambda n: -(-n // world) * world  # noqa: E731
    bias_bytes = 4 * (padded(128) + padded(63) + padded(96))  # float32, padded to a multiple of world
    if world == 2:
        # A: 64 rows a rank x (32 + 4) bytes, both copies the same size; B uneven: (32, 128) uint8 a
        # rank, int16 with both copies; C: 48 rows a rank x 36 bytes (the row-wise copy, the larger)
        one = 2 * 64 * 36 + 2 * 32 * 128 + 2 * 48 * 36
        both = 2 * 64 * 72 + 2 * 2 * 32 * 128 + 2 * 48 * (36 + 36)
        assert fwd["nvfp4"] - bias_bytes == one and bwd["nvfp4"] - bias_bytes == one, (fwd, bwd)
        assert fwd["nvfp4_root"] - bias_bytes == both and bwd["nvfp4_root"] == 0, (fwd, bwd)
        elements = 128 * 64 + 64 * 128 + 96 * 63  # B padded to 64 rows, as FSDP2 gathers it
        assert fwd["bf16"] - bias_bytes // 2 == 2 * elements, fwd
        print(f"weights only, a copy: nvfp4 {one} bytes = {one / (2 * elements):.3f}x bfloat16's "
              f"{2 * elements} (even shards: 0.5625 bytes an element; the uneven B: 1)")
    else:
        # A: 32 rows a rank x 36 bytes; B uneven: (16, 128) uint8 a rank; C in float32 (24 x 63 a rank)
        one = 4 * 32 * 36 + 4 * 16 * 128 + 4 * 4 * 24 * 63
        assert fwd["nvfp4"] - bias_bytes == one and bwd["nvfp4"] - bias_bytes == one, (fwd, bwd)
