"""The one registry (python/csrc/registry.hpp): the names Python offers are the ones the op libraries
serve, as the ops list them, and the lists agree with one another (each linear recipe's GEMMs are
served scaled_mm pairs of named recipes); a name outside a list is refused with the whole list."""

import pytest
import torch

import octet.torch as ot
from octet.torch import optim as oo

_ops = torch.ops.octet


def test_names_come_from_the_ops():
    assert ot.RECIPES == tuple(_ops.recipe_names())
    assert list(ot.LINEAR_RECIPES) == list(_ops.linear_recipe_names())
    names = _ops.scaled_mm_pairs()
    assert ot.SCALED_MM_PAIRS == tuple(zip(names[0::2], names[1::2])) and len(names) % 2 == 0
    assert oo.CODECS == tuple(_ops.adamw_codec_names()) and oo.MASTERS == tuple(_ops.adamw_master_names())
    for names in (ot.RECIPES, list(ot.LINEAR_RECIPES), ot.SCALED_MM_PAIRS, oo.CODECS, oo.MASTERS):
        assert names and len(set(names)) == len(names)


@pytest.mark.parametrize("name", list(ot.LINEAR_RECIPES))
def test_linear_recipe_is_made_of_served_pieces(name):
    cfg = ot.LINEAR_RECIPES[name]
    x, w, g, delayed, stochastic, hadamard, on_cuda = _ops.linear_recipe_info(name)
    assert (cfg.x, cfg.w, cfg.g) == (x, w, g) and {x, w, g} <= set(ot.RECIPES)
    assert (cfg.delayed, cfg.stochastic_gradients, cfg.hadamard_wgrad) == (delayed, stochastic, hadamard)
    assert isinstance(on_cuda, bool)
    # forward X W^T, data gradient dY W (W's column-wise copy), weight gradient dY^T X
    assert {(x, w), (g, w), (g, x)} <= set(ot.SCALED_MM_PAIRS)
    # convert()'s dimension multiple: a multiple of every block edge of the recipe's copies and of
    # 16 (the values of the table linear.py held before it asked the ops)
    before = {"tensorwise": 16, "tensorwise_delayed": 16, "blockwise": 128, "mxfp8": 32, "nvfp4": 16}
    assert cfg.dim_multiple == before.get(name, cfg.dim_multiple)
    for r in (x, w, g):
        for edge in (ot.recipe_info(r).block_rows, ot.recipe_info(r).block_cols, 16):
            assert cfg.dim_multiple % max(edge, 1) == 0


def test_unknown_names_are_refused_with_the_list():
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match=", ".join(ot.LINEAR_RECIPES)):
        _ops.linear_forward(x, w, None, "fp8")
    with pytest.raises(ValueError, match=", ".join(ot.RECIPES)):
        _ops.recipe_info("fp8")
    with pytest.raises(ValueError, match=", ".join(oo.MASTERS)):
        _ops.adamw_state_sizes("fp32", "fp32", "fp64", 16)
    with pytest.raises(ValueError, match=", ".join(oo.CODECS)):
        _ops.adamw_state_sizes("fp64", "fp64", "fp32", 16)
    with pytest.raises(ValueError, match=", ".join(f"{a} x {b}" for a, b in ot.SCALED_MM_PAIRS)):
        a, _, _ = ot.quantize(torch.randn(4, 32), "tensorwise_e4m3")
        b, _, _ = ot.quantize(torch.randn(8, 32), "mxfp8_e4m3")
        ot.scaled_mm(a, b)


@pytest.mark.parametrize("master", oo.MASTERS)
@pytest.mark.parametrize("codec", oo.CODECS)
def test_every_codec_and_master_is_served(codec, master):
    assert len(_ops.adamw_state_sizes(codec, codec, master, 256)) == 6
