"""IPython extension: ``%load_ext tpu_interactive`` registers ``%%tpu`` and ``%tpu``.

The IPython-free parts (formatting, namespace scan, cell tracking, summaries, hooks) live in
``tpu_interactive.session``; ``extension`` imports IPython, and only when the extension is loaded.
"""
from __future__ import annotations

from typing import Callable


def load_ipython_extension(ipython, dashboard: Callable | None = None) -> None:
    """``dashboard(ns)`` shows the widgets for ``%tpu dashboard`` (tpu_interactive.dashboard when
    loaded as ``%load_ext tpu_interactive``)."""
    from .extension import load

    load(ipython, dashboard)


def unload_ipython_extension(ipython) -> None:
    from .extension import unload

    unload(ipython)


__all__ = ["load_ipython_extension", "unload_ipython_extension"]
