import os
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import tpu_interactive  # noqa: E402,F401  (registers the device)
from tpu_interactive.backend.dispatch import TPUFallbackWarning  # noqa: E402


@pytest.fixture
def no_fallback():
    """Fail the test if any op silently took the CPU fallback."""
    before = dict(tpu_interactive.stats()["fallback_counts"])
    yield
    after = tpu_interactive.stats()["fallback_counts"]
    new = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    assert not new, f"ops fell back to CPU: {new}"


@pytest.fixture(autouse=True)
def _restore_flags():
    cfg = tpu_interactive.config
    saved = (cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes)
    yield
    cfg.sync, cfg.nan_check, cfg.cpu_fallback, cfg.pallas, cfg.memory_limit_bytes = saved
