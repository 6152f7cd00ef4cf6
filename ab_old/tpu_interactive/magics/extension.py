"""``%load_ext tpu_interactive``: the %%tpu cell magic, the %tpu line magic, completion and hooks."""
from __future__ import annotations

import shlex
from typing import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from tpu_interactive import backend
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.backend.versions import PACKAGE_VERSION
from tpu_interactive.session import pictures, summary
from tpu_interactive.session.hooks import install_hooks, remove_hooks
from tpu_interactive.session.tracker import TRACKER

from . import cell as cell_mod

ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False}


def _flag(sub: str, rest: list[str]) -> bool | None:
    if not rest:
        return None
    if len(rest) > 1 or rest[0].lower() not in ON_OFF:
        raise UsageError(f"%tpu {sub} takes 'on' or 'off', got {' '.join(rest)!r}")
    return ON_OFF[rest[0].lower()]


def _switch_text(name: str, switch: Callable, rest: list[str], sub: str) -> str:
    value = _flag(sub, rest)
    if value is not None:
        switch(value)
    return f"{name} {'on' if switch() else 'off'}"


@magics_class
class TPUMagics(Magics):
    @magic_arguments()
    @argument("--sync", action="store_true", help="block on every op so errors surface at the op that caused them")
    @argument("--no-sync", action="store_true", help="run asynchronously even if sync mode is on globally")
    @argument("--nan-check", action="store_true", help="raise at the first op producing NaN/Inf (implies --sync)")
    @argument("--pallas", choices=("on", "off"), help="use Pallas kernels for this cell (on) or plain XLA (off)")
    @argument("--fuse", action="store_true",
              help="fused eager mode for this cell: ops are recorded and run as one cached program per segment")
    @argument("--compile", action="store_true",
              help="list every torch.compile(backend='tpu') compile of the cell: graph, hit/miss, cause, time")
    @argument("--profile", action="store_true",
              help="run in sync mode and print per-op device time (the backend's per-op timers; "
                   "this does not use jax.profiler: --profile-trace does)")
    @argument("--profile-trace", nargs="?", const="", default=None, metavar="DIR",
              help="like --profile, and record the cell with torch.profiler and jax.profiler: a Chrome/Perfetto "
                   "trace (DIR/torch_trace.json) and a jax trace directory (DIR/jax); DIR defaults to "
                   "./tpu_profiles/<time>")
    @argument("--memory-trace", action="store_true",
              help="record the cell's memory history (torch.tpu.memory._record_memory_history) and plot it: "
                   "bytes in use over the cell's allocations and the largest tensors at its peak")
    @argument("--quiet", action="store_true", help="no report after the cell")
    @argument("-h", "--help", action="store_true", help="show this help")
    @cell_magic
    def tpu(self, line: str, cell: str):
        """Run the cell with `tpu` as the default device and report what it did.

        Reports wall time, ops executed (top ops by time), compiles, CPU fallbacks, host<->device
        transfers, and the memory delta and peak of the cell. Every setting changed for the cell
        (default device, sync, nan-check, pallas) is restored afterwards, also when it raises.
        """
        __tracebackhide__ = True  # noqa: F841
        try:
            args = parse_argstring(self.tpu, line)
        except ValueError as exc:  # unbalanced quotes from shlex
            raise UsageError(f"%%tpu: {exc}") from None
        if args.help:
            print(self.tpu.parser.format_help())
            return None
        if args.sync and args.no_sync:
            raise UsageError("%%tpu: --sync and --no-sync contradict each other")
        if args.no_sync and (args.nan_check or args.profile or args.profile_trace is not None):
            raise UsageError("%%tpu: --no-sync cannot be combined with --nan-check, --profile or --profile-trace "
                             "(they sync per op)")
        return cell_mod.run(self.shell, cell, args)

    @line_magic("tpu")
    def tpu_line(self, line: str):
        """%tpu status | sync on|off | nan-check on|off | pallas on|off | fuse on|off | memory [--plot] | cells [--plot] |
        cache [clear] | compiles [clear] | placement | fallbacks | ops [N] | ops --lowerings [substring] |
        reset | dashboard | help"""
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%tpu: {exc}") from None
        sub, rest = (words[0].lower(), words[1:]) if words else ("status", [])
        if sub in ("-h", "--help"):
            sub = "help"
        handler = SUBCOMMANDS.get(sub)
        if handler is None:
            raise UsageError(f"%tpu: unknown subcommand {sub!r}; choose one of: {', '.join(SUBCOMMANDS)}")
        text = handler(self.shell, sub, rest)
        if text:
            print(text)


def _no_args(fn: Callable) -> Callable:
    def handler(shell, sub, rest):
        if rest:
            raise UsageError(f"%tpu {sub} takes no arguments, got {' '.join(rest)!r}")
        return fn(shell)

    return handler


def _cache(shell, sub, rest):
    if not rest:
        return summary.cache_text()
    if rest == ["clear"]:
        return summary.clear_compile_cache()
    raise UsageError(f"%tpu cache takes nothing or 'clear', got {' '.join(rest)!r}")


def _ops(shell, sub, rest):
    if rest and rest[0] == "--lowerings":
        if len(rest) > 2:
            raise UsageError(f"%tpu ops --lowerings takes an optional op-name substring, got {' '.join(rest[1:])!r}")
        return summary.lowerings_text(rest[1] if len(rest) == 2 else "")
    if len(rest) > 1 or (rest and not rest[0].isdigit()):
        raise UsageError(f"%tpu ops takes an optional number of ops to show or --lowerings [substring], "
                         f"got {' '.join(rest)!r}")
    return summary.ops_text(int(rest[0]) if rest else 20)


def _reset(shell):
    backend_stats.reset()
    TRACKER.reset()
    return "tpu counters reset (op counts, fallbacks, transfers, compiles, peak memory)"


def _show(bundle: dict) -> None:
    from IPython.display import display

    display(bundle, raw=True)


def _memory(shell, sub, rest):
    if not rest:
        return summary.memory_text(shell.user_ns)
    if rest != ["--plot"]:
        raise UsageError(f"%tpu memory takes nothing or '--plot', got {' '.join(rest)!r}")
    svgs = [pictures.cells_svgs()[0]]
    timeline = pictures.timeline_svg(shell.user_ns)
    if timeline is not None:
        svgs.insert(0, timeline)
    _show(pictures.svg_bundle(svgs, pictures.timeline_text(shell.user_ns) + "\n\n" + pictures.cells_text()))
    return None


def _cells(shell, sub, rest):
    if not rest:
        return pictures.cells_text()
    if rest != ["--plot"]:
        raise UsageError(f"%tpu cells takes nothing or '--plot', got {' '.join(rest)!r}")
    _show(pictures.svg_bundle(list(pictures.cells_svgs()), pictures.cells_text()))
    return None


# `%tpu dashboard` shows the widgets, which this package does not import (magics and widgets are
# peers over session/): the package's load_ipython_extension hands its dashboard function in.
_DASHBOARD: list[Callable | None] = [None]


def _dashboard(shell):
    show = _DASHBOARD[0]
    if show is None:
        raise UsageError("%tpu dashboard needs the widgets: load the extension as %load_ext tpu_interactive")
    show(shell.user_ns)
    return None


SUBCOMMANDS: dict[str, Callable] = {
    "status": _no_args(lambda shell: summary.status_text()),
    "sync": lambda shell, sub, rest: _switch_text("sync mode", backend.sync_mode, rest, sub),
    "nan-check": lambda shell, sub, rest: _switch_text("nan_check", backend.nan_check, rest, sub),
    "pallas": lambda shell, sub, rest: _switch_text("pallas", backend.pallas, rest, sub),
    "fuse": lambda shell, sub, rest: _switch_text("fused eager mode", backend.fusion.switch, rest, sub),
    "memory": _memory,
    "cells": _cells,
    "cache": _cache,
    "compiles": _cache,
    "placement": _no_args(lambda shell: summary.placement_text(shell.user_ns)),
    "fallbacks": _no_args(lambda shell: summary.fallbacks_text()),
    "ops": _ops,
    "reset": _no_args(_reset),
    "dashboard": _no_args(_dashboard),
    "help": _no_args(lambda shell: _help_text()),
}


def _help_text() -> str:
    return ("%tpu " + " ".join(TPUMagics.tpu_line.__doc__.split()) + "\n\ncell magic:\n"
            + TPUMagics.tpu.parser.format_help())


SUBCOMMAND_ARGS = {"sync": ["on", "off"], "nan-check": ["on", "off"], "pallas": ["on", "off"], "fuse": ["on", "off"],
                   "cache": ["clear"],
                   "compiles": ["clear"], "memory": ["--plot"], "cells": ["--plot"], "ops": ["--lowerings"]}
CELL_OPTIONS = ["--sync", "--no-sync", "--nan-check", "--pallas", "--fuse", "--compile", "--profile", "--profile-trace",
               "--memory-trace", "--quiet", "--help"]


# ---------------------------------------------------------------- completion
def complete_line(shell, event) -> list[str]:
    """Completions for `%tpu <subcommand> [argument]`."""
    words = event.text_until_cursor.split()
    typing_new = event.text_until_cursor.endswith(" ")
    position = len(words) - (0 if typing_new else 1)  # index of the word being completed
    if position <= 1:
        return list(SUBCOMMANDS)
    if position == 2:
        return SUBCOMMAND_ARGS.get(words[1].lower(), [])
    return []


def complete_cell(shell, event) -> list[str]:
    words = event.text_until_cursor.split()
    if len(words) >= 2 and words[-2 if not event.text_until_cursor.endswith(" ") else -1] == "--pallas":
        return ["on", "off"]
    return CELL_OPTIONS


def _remove_completers(shell) -> None:
    dispatch = shell.strdispatchers.get("complete_command")
    if dispatch is not None:
        for key in ("%tpu", "%%tpu"):
            dispatch.strs.pop(key, None)


def load(shell, dashboard: Callable | None = None) -> None:
    _DASHBOARD[0] = dashboard
    shell.register_magics(TPUMagics)
    _remove_completers(shell)  # reloading must not stack completers
    shell.set_hook("complete_command", complete_line, str_key="%tpu")
    shell.set_hook("complete_command", complete_cell, str_key="%%tpu")
    install_hooks(shell)
    info = backend.backend_info()
    print(f"tpu_interactive {PACKAGE_VERSION} loaded: {info.summary} | %%tpu runs a cell on tpu; "
          "%tpu status | dashboard | help")
    for warning in info.warnings:
        print(f"WARNING: {warning}")


def unload(shell) -> None:
    remove_hooks(shell)
    _remove_completers(shell)
    manager = shell.magics_manager
    manager.magics["line"].pop("tpu", None)
    manager.magics["cell"].pop("tpu", None)
    manager.registry.pop(TPUMagics.__name__, None)
    print("tpu_interactive unloaded: %%tpu and %tpu removed (tpu tensors stay valid)")
