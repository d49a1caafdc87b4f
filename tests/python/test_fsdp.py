"""octet's AdamW on FSDP2's sharded parameters (DTensor), on the CPU with gloo: 2 and 4 processes.

Oracles: one process stepping the whole parameters with the same gradients (bit for bit: a shard's
state is the slice of the whole parameter's state, whatever the number of ranks), the same run
resumed from a torch.distributed.checkpoint on another world size (bit for bit), and one process
training on the whole batch (within float32 rounding: FSDP2 sums the ranks' gradients in another
order). The worker functions are in fsdp_cases.py.
"""

import os

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this torch build")

import fsdp_cases as cases  # noqa: E402


def spawn(fn, world, tmp_path, *args):
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(world, str(tmp_path / f"init.{fn.__name__}.{world}"), str(tmp_path), *args), nprocs=world,
             join=True)


def load(tmp_path, name):
    return torch.load(os.path.join(tmp_path, name))


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_steps_match_one_process_bit_for_bit(world, tmp_path):
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
        step, torch_state = load(tmp_path, f"refused.rank{rank}.pt")
        assert "DTensor gradient" in step, step
        assert "torch.distributed.checkpoint" in torch_state, torch_state


def test_checkpoint_saved_on_2_resumes_on_4_bit_identically(tmp_path):
    spawn(cases.save, 2, tmp_path)
    spawn(cases.resume, 2, tmp_path, "on2")
    spawn(cases.resume, 4, tmp_path, "on4")
    for codec, master in cases.RESHARD_CASES:
        saved_params, saved_opt = cases.single_process(codec, master, range(cases.STEPS))
        params, _ = cases.single_process(codec, master, range(2 * cases.STEPS))
        on2 = load(tmp_path, f"on2.{codec}.{master}.rank0.pt")
        for world, name in ((2, "on2"), (4, "on4")):
            for rank in range(world):
                got = load(tmp_path, f"{name}.{codec}.{master}.rank{rank}.pt")
                for i, (a, b) in enumerate(zip(got["loaded_params"], saved_params)):
                    assert torch.equal(a, b), f"{codec}/{master}: loaded parameter {i} on {world} ranks"
                for a, b in zip(got["loaded_state"], on2["loaded_state"]):
                    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (codec, master, world)
                for i, (a, b, c) in enumerate(zip(got["params"], on2["params"], params)):
                    assert torch.equal(a, b), f"{codec}/{master}: parameter {i} after resuming on {world} ranks"
                    assert torch.equal(a, c), f"{codec}/{master}: parameter {i} against the uninterrupted run"


def test_training_under_fsdp2_follows_one_process(tmp_path):
    steps = 5
    spawn(cases.fsdp_training, 2, tmp_path, steps)
    model = cases.mlp()
    opt = __import__("octet.torch", fromlist=["AdamW"]).AdamW(model.parameters(), lr=1e-3, m_codec="fp32",
                                                               master="fp32")
    losses = []
    for step in range(steps):
        x, y = cases.batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    first = load(tmp_path, "fsdp_training.rank0.pt")
    for rank in range(2):
        got = load(tmp_path, f"fsdp_training.rank{rank}.pt")
        for a, b in zip(got["params"], first["params"]):
            assert torch.equal(a, b), "the ranks' parameters differ"
    # Adam's first steps move each weight by about lr whatever the gradient's size, so a gradient
    # that differs in its last bits moves a weight by far less than lr: 1e-5 is 1% of it.
    for a, p in zip(first["params"], model.parameters()):
        assert torch.allclose(a, p.detach(), rtol=0, atol=1e-5), (a - p.detach()).abs().max()
    assert torch.allclose(first["losses"], torch.tensor(losses), rtol=1e-5, atol=0)
    assert losses[-1] < losses[0]
