"""Notebook dashboards for the tpu device: memory, compile cache, tensor placement and switches.

``tpu_interactive.dashboard()`` (or ``%tpu dashboard``) shows them together. They are built from
ipywidgets' built-in widgets only, over the backend's public stats API and ``tpu_interactive.session``
(never the magics: both are peers over session).
"""
from __future__ import annotations

from typing import Any, Mapping


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _has_widget_frontend(shell) -> bool:
    """Terminal IPython has no frontend to draw widgets: it gets the plain-text view instead."""
    return shell is not None and getattr(shell, "kernel", None) is not None


def dashboard(ns: Mapping[str, Any] | None = None, display: bool = True):
    """Show the dashboard (in a notebook) or print its text (terminal IPython / no IPython).

    It refreshes after every cell (post_run_cell hook) and when its Refresh button is clicked.
    With ``display=False`` the :class:`Dashboard` widget is returned instead of shown.
    """
    from IPython.display import display as ipy_display

    from tpu_interactive.session.hooks import install_hooks
    from tpu_interactive.session.tracker import TRACKER

    from .panels import Dashboard

    shell = _shell()
    if ns is None:
        ns = shell.user_ns if shell is not None else {}
    board = Dashboard(ns)
    if shell is not None:
        install_hooks(shell)
        TRACKER.add_refresher(board)
    if not display:
        return board
    if _has_widget_frontend(shell):
        board._handle = ipy_display(board, display_id=True)
    else:
        print(board.text())
    return None


def __getattr__(name: str):
    if name in ("Dashboard", "MemoryPanel", "CompilePanel", "PlacementPanel", "SwitchPanel", "PlotsPanel"):
        from . import panels

        return getattr(panels, name)
    raise AttributeError(name)


__all__ = ["dashboard", "Dashboard", "MemoryPanel", "CompilePanel", "PlacementPanel", "SwitchPanel", "PlotsPanel"]
