"""Shared fixtures of the Python tests: a fresh seed per run (printed, so a failure can be replayed
with OCTET_SEED=<n>), and the package under test."""

import os
import random

import pytest


def _seed():
    return int(os.environ.get("OCTET_SEED", random.SystemRandom().randrange(2**31)))


SEED = _seed()


def pytest_report_header(config):
    return f"octet: OCTET_SEED={SEED}"


@pytest.fixture
def gen():
    """A torch.Generator seeded from this run's seed (differs per run unless OCTET_SEED is set)."""
    import torch

    g = torch.Generator()
    g.manual_seed(SEED)
    return g


@pytest.fixture
def np_rng():
    """A numpy Generator seeded from this run's seed (for tests that must not import torch: JAX)."""
    import numpy as np

    return np.random.default_rng(SEED)
