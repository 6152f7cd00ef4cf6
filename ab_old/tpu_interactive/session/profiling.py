"""``tpu_interactive.profile()``: profile a block (or a ``%%tpu --profile-trace`` cell) with
``torch.profiler`` and ``jax.profiler`` and print what it did.

The block runs in sync mode, so each aten op's time in torch.profiler (and in the backend's per-op
timers) includes the device work it started. Written next to each other in one directory:

- ``torch_trace.json``: torch.profiler's Chrome trace (open in Perfetto, https://ui.perfetto.dev,
  or chrome://tracing): the aten ops the block ran on tpu, with input shapes;
- ``jax/``: jax.profiler's trace directory (``tensorboard --logdir`` with the profile plugin, XProf):
  the XLA programs and their device activity.

The summary's counts (ops, compiles, transfers, peak memory) are the backend's own counters over
the block, the same numbers as ``tpu_interactive.stats()`` deltas.
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import warnings
from typing import Any, Iterator

import torch

from tpu_interactive import backend

from . import summary
from .fmt import fmt_bytes
from .tracker import TRACKER, CellDelta

_counter = itertools.count(1)


class Profile:
    """What one profiled block left behind: the trace paths, its counters and the summary text."""

    def __init__(self, directory: str):
        self.directory = directory
        self.trace_path = os.path.join(directory, "torch_trace.json")
        self.jax_trace_dir: str | None = None
        self.delta: CellDelta | None = None
        self.profiler: torch.profiler.profile | None = None
        self.error: BaseException | None = None
        self.notes: list[str] = []

    def key_averages(self):
        """torch.profiler's per-op table (``prof.key_averages().table(...)``)."""
        return self.profiler.key_averages()

    def summary(self, top: int = 10) -> str:
        if self.delta is None:
            return "[tpu profile] still running"
        d = self.delta.diff
        lines = [f"[tpu profile] {summary.fmt_seconds(self.delta.wall_seconds)} wall, sync on"
                 + (f", raised {type(self.error).__name__}" if self.error is not None else "")]
        lines.append(summary.op_table(d.get("op_counts", {}), d.get("op_seconds", {}),
                                      title="  top ops by device time (synced per op):", top=top))
        lines += summary.compile_lines(self.delta)
        lines.append(f"  transfers  host->device {d.get('h2d_count', 0)} ({fmt_bytes(d.get('h2d_bytes', 0))}), "
                     f"device->host {d.get('d2h_count', 0)} ({fmt_bytes(d.get('d2h_bytes', 0))})")
        lines.append(f"  memory     peak {fmt_bytes(self.delta.peak)}, "
                     f"{fmt_bytes(self.delta.memory_delta, signed=True)} -> {fmt_bytes(self.delta.live_after)} live")
        lines += self.trace_lines()
        return "\n".join(lines)

    def trace_lines(self) -> list[str]:
        lines = []
        if os.path.exists(self.trace_path):
            lines.append(f"  trace      {self.trace_path} (torch.profiler; open in https://ui.perfetto.dev)")
        if self.jax_trace_dir:
            lines.append(f"  jax trace  {self.jax_trace_dir} (jax.profiler; tensorboard --logdir / XProf)")
        lines += [f"  note       {n}" for n in self.notes]
        return lines

    def __repr__(self) -> str:
        return self.summary()


def default_directory() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(os.getcwd(), "tpu_profiles", f"{stamp}-{os.getpid()}-{next(_counter)}")


def _make_directory(path: str) -> str:
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".tpu_write_check")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot write the profile to {path!r}: {exc.strerror}; nothing was run, "
                                   "pass a writable directory (profile(path=...) / %%tpu --profile-trace DIR)",
                        path) from exc
    return path


@contextlib.contextmanager
def _jax_trace(prof: Profile, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    import jax

    directory = os.path.join(prof.directory, "jax")
    try:
        jax.profiler.start_trace(directory)
    except Exception as exc:  # noqa: BLE001 - e.g. another jax trace is running: keep the torch trace
        prof.notes.append(f"jax.profiler did not start ({exc}); only the torch.profiler trace was written")
        yield
        return
    try:
        yield
    finally:
        try:
            jax.profiler.stop_trace()
            prof.jax_trace_dir = directory
        except Exception as exc:  # noqa: BLE001
            prof.notes.append(f"jax.profiler did not stop cleanly ({exc})")


@contextlib.contextmanager
def profile(path: str | os.PathLike | None = None, *, jax_trace: bool = True, show: bool = True,
            record_shapes: bool = True, top: int = 10) -> Iterator[Profile]:
    """Profile the block: ``with tpu_interactive.profile() as prof: ...``.

    ``path`` is the output directory (default ``./tpu_profiles/<time>-<pid>-<n>``; made if missing;
    an unwritable one raises OSError naming it before anything runs). The block runs in sync mode
    under ``torch.profiler`` (CPU activity with shapes: tpu aten ops, device-inclusive) and, with
    ``jax_trace``, ``jax.profiler``. On exit the Chrome trace is written and, with ``show``, the
    summary printed; a block that raises still writes what it has, then the error propagates.
    """
    prof = Profile(_make_directory(os.fspath(path) if path is not None else default_directory()))
    activities = [torch.profiler.ProfilerActivity.CPU]
    measurement = TRACKER.measure()
    try:
        with _jax_trace(prof, jax_trace), backend.sync_mode(True), \
                torch.profiler.profile(activities=activities, record_shapes=record_shapes) as torch_prof:
            prof.profiler = torch_prof
            yield prof
    except BaseException as exc:
        prof.error = exc
        raise
    finally:
        prof.delta = measurement.finish()
        _export(prof)
        if show:
            print(prof.summary(top))


def _export(prof: Profile) -> None:
    """Write the Chrome trace; a failure here is reported, never raised over the user's own error."""
    if prof.profiler is None:
        return
    try:
        prof.profiler.export_chrome_trace(prof.trace_path)
    except Exception as exc:  # noqa: BLE001
        if prof.error is None:
            raise
        prof.notes.append(f"the torch trace could not be written to {prof.trace_path!r}: {exc}")
        warnings.warn(prof.notes[-1], RuntimeWarning, stacklevel=3)


def trace_events(path: str) -> list[dict[str, Any]]:
    """The events of a Chrome trace JSON file (a list, or ``{"traceEvents": [...]}``)."""
    import json

    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data
