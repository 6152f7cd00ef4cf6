"""The body of ``%%tpu``: run a cell with tpu as the default device, then report what it did."""
from __future__ import annotations

import ast
import contextlib
from typing import Any, Iterator

import torch

from tpu_interactive import backend
from tpu_interactive.session import summary
from tpu_interactive.session.tracker import TRACKER


@contextlib.contextmanager
def default_device(device: str) -> Iterator[None]:
    """``torch.set_default_device(device)`` for a block; the previous default comes back even on error."""
    holder = torch._GLOBAL_DEVICE_CONTEXT
    previous = getattr(holder, "device_context", None)
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(previous.device if previous is not None else None)


@contextlib.contextmanager
def switches(sync: bool | None, nan_check: bool, pallas: bool | None, fuse: bool = False) -> Iterator[None]:
    """The cell's sync / nan_check / pallas / fused-mode settings, restored afterwards."""
    with contextlib.ExitStack() as stack:
        if fuse:
            stack.enter_context(backend.fuse(True))
        if sync is not None:
            stack.enter_context(backend.sync_mode(sync))
        if nan_check:
            stack.enter_context(backend.nan_check(True))
        if pallas is not None:
            stack.enter_context(backend.pallas(pallas))
        yield


@contextlib.contextmanager
def memory_trace(shell, quiet: bool) -> Iterator[None]:
    """Record the cell's memory history (a fresh recording) and show its timeline afterwards."""
    memory = torch.tpu.memory
    memory._record_memory_history("all", stacks="python", clear_history=True)
    try:
        yield
    finally:
        memory._record_memory_history(None)
        if not quiet:
            from IPython.display import display

            from tpu_interactive.session import pictures

            svg = pictures.timeline_svg(shell.user_ns)
            display(pictures.svg_bundle([svg], pictures.timeline_text(shell.user_ns)), raw=True)


def execute(shell, cell: str) -> Any:
    """Run ``cell`` in the user namespace like a normal cell; returns the last expression's value.

    A blank line is prepended so line numbers in tracebacks and error messages match the cell as
    displayed (its first line is ``%%tpu``)."""
    __tracebackhide__ = True  # noqa: F841 - IPython hides this frame from tracebacks
    source = "\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(source, shell.execution_count, raw_code="\n" + cell)
    tree = shell.compile.ast_parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    glob, loc = shell.user_global_ns, shell.user_ns
    exec(shell.compile(tree, filename, "exec"), glob, loc)
    if last is not None:
        return eval(shell.compile(last, filename, "eval"), glob, loc)
    return None


def error_line(exc: BaseException) -> str:
    """'RuntimeError in aten::addmm at line 4: y = model(x)' from the backend's annotations."""
    where = getattr(exc, "user_frame", None)
    text = f"  error      {type(exc).__name__}"
    op = getattr(exc, "op", None)
    if op:
        text += f" in {op}"
    if where:
        _, lineno, _, source = where
        text += f" at cell line {lineno}" + (f": {source}" if source else "")
    return text


def run(shell, cell: str, args) -> Any:
    __tracebackhide__ = True  # noqa: F841
    traced = args.profile_trace is not None
    sync = True if (args.sync or args.profile or traced) else (False if args.no_sync else None)
    pallas = None if args.pallas is None else args.pallas == "on"
    cfg = backend.config
    synced = (cfg.sync if sync is None else sync) or args.nan_check or cfg.nan_check
    measurement = TRACKER.measure()
    error: BaseException | None = None
    prof = None
    try:
        with contextlib.ExitStack() as stack:
            if traced:  # an unwritable directory raises here, before the cell runs
                from tpu_interactive.session.profiling import profile

                prof = stack.enter_context(profile(args.profile_trace or None, show=False))
            if args.memory_trace:
                stack.enter_context(memory_trace(shell, args.quiet))
            with default_device("tpu"), switches(sync, args.nan_check, pallas, args.fuse):
                result = execute(shell, cell)
                backend.fusion.flush("end of the %%tpu cell")  # what the cell recorded runs in the cell
                return result
    except BaseException as exc:
        error = exc
        raise
    finally:
        if not args.quiet and (prof is not None or not traced):
            delta = measurement.finish()
            report = summary.cell_report(delta, sync=synced, compile_details=args.compile,
                                         profile=args.profile or traced)
            if prof is not None:
                report += "\n" + "\n".join(prof.trace_lines())
            if error is not None:
                report += "\n" + error_line(error)
            print(report)
