"""tpu_interactive: a TPU as a native, eager-first PyTorch device, visible in Jupyter.

    import tpu_interactive as torch_tpu
    device = torch_tpu.device()          # torch.device('tpu:0')
"""
from __future__ import annotations

import torch

from .backend import backend_info, config, cpu_fallback, fuse, memory_stats, nan_check, pallas, sync_mode
from .backend.compiler import compile  # noqa: A004  (torch.compile with backend="tpu")
from .backend.train_step import compile_train_step
from .backend.versions import PACKAGE_VERSION
from .backend.stats import diff as stats_diff
from .backend.stats import reset as reset_stats
from .backend.stats import snapshot as stats
from .launcher import LaunchError, launch

__version__ = PACKAGE_VERSION


def device(index: int = 0) -> torch.device:
    """The tpu torch device (``torch.device('tpu', 0)``)."""
    return torch.device("tpu", index)


def synchronize() -> None:
    """Wait for all pending device work (like ``torch.cuda.synchronize``)."""
    torch.tpu.synchronize()


def load_ipython_extension(ipython) -> None:
    from .magics import load_ipython_extension as _load

    _load(ipython, dashboard=dashboard)


def unload_ipython_extension(ipython) -> None:
    from .magics import unload_ipython_extension as _unload

    _unload(ipython)


def profile(path=None, **kwargs):
    """Profile a block with torch.profiler and jax.profiler (see :func:`tpu_interactive.profiling.profile`):
    ``with tpu_interactive.profile() as prof: ...`` prints a summary and writes a Chrome trace."""
    from .session.profiling import profile as _profile

    return _profile(path, **kwargs)


def dashboard(ns=None, display: bool = True):
    """Memory, compile-cache and placement widgets plus sync/Pallas toggles (see tpu_interactive.widgets)."""
    from .widgets import dashboard as _dashboard

    return _dashboard(ns, display=display)


def __getattr__(name: str):
    # ``tpu_interactive.plots`` / ``.profiling`` (documented names) are the session modules, imported on use
    if name in ("plots", "profiling"):
        import importlib

        return importlib.import_module(f"{__name__}.session.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["launch", "LaunchError", "compile", "compile_train_step", "dashboard", "profile", "device", "synchronize", "backend_info", "config",
           "sync_mode", "fuse", "nan_check", "pallas", "cpu_fallback", "memory_stats", "stats", "stats_diff", "reset_stats"]
