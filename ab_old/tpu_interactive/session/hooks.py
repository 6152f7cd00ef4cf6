"""The per-cell hooks: the cell tracker measures every cell and refreshes the dashboards after it.

Registered on an IPython shell's ``pre_run_cell``/``post_run_cell`` events by both the extension
(``%load_ext tpu_interactive``) and ``tpu_interactive.dashboard()``; idempotent per shell. Only the
shell object passed in is used: no IPython import here.
"""
from __future__ import annotations

from typing import Any

from tpu_interactive.backend import fusion

from .tracker import TRACKER


def _pre_run_cell(info: Any = None) -> None:
    TRACKER.begin()


class _PostRunCell:
    def __init__(self, shell: Any):
        self.shell = shell

    def __call__(self, result: Any = None) -> None:
        try:  # under `%tpu fuse on` a cell's recorded ops run before the cell counts as done
            fusion.flush("end of the cell")
        except Exception as exc:  # noqa: BLE001 - a hook must not raise; the error is shown, the kernel lives
            print(f"[tpu] the cell's fused ops failed when run at its end: {type(exc).__name__}: {exc}")
        count = getattr(result, "execution_count", None)
        TRACKER.end(f"[{count}]" if count is not None else "")
        TRACKER.refresh_all(self.shell.user_ns)


_installed: dict[int, tuple] = {}


def install_hooks(shell: Any) -> None:
    """Register the pre/post_run_cell hooks on ``shell`` (once per shell)."""
    if id(shell) in _installed:
        return
    post = _PostRunCell(shell)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_run_cell", post)
    _installed[id(shell)] = (_pre_run_cell, post)


def remove_hooks(shell: Any) -> None:
    hooks = _installed.pop(id(shell), None)
    if hooks is None:
        return
    for event, fn in zip(("pre_run_cell", "post_run_cell"), hooks):
        try:
            shell.events.unregister(event, fn)
        except ValueError:
            pass
