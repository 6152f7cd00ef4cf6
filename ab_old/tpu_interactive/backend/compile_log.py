"""Every XLA compilation the backend causes, eager ops included, and JAX's persistent compilation cache.

JAX announces its compilations through ``jax.monitoring``: tracing a jaxpr, lowering it to MLIR, then
the backend compile (which also covers a read of the persistent cache, reported by a ``cache_hits``
event when the executable came from disk). An eager op's first call at a new shape compiles one or
more programs there, so listening to these events sees every compile — torch.compile graphs,
``compile_train_step`` and plain eager ops alike — with no cost on the warm path. Each backend compile
is attributed, by walking the Python stack (only when a compile happens), to the aten op being
dispatched (or the compiled graph being called), its inputs' shapes and dtypes, and the user's line.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from typing import Any, Iterator

import jax
import torch

from .config import config
from .errors import user_frame
from .stats import record_xla_compile

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_FRONTEND = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
DISK_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_local = threading.local()  # per thread: tracing/lowering seconds before the backend compile, disk hit


def _state():
    if not hasattr(_local, "frontend"):
        _local.frontend, _local.trace, _local.disk_hit, _local.xla_compiles = 0.0, 0.0, False, 0
    return _local


def xla_compiles() -> int:
    """How many backend compiles XLA itself ran on this thread (JAX's persistent cache answered none
    of them). A ``lowered.compile()`` that moves this count made its executable now; one that does
    not was read from disk, or handed back from memory by jax (a jitted function already called or
    compiled with those inputs: no compile event at all)."""
    return _state().xla_compiles


def _on_event(event: str, **_: Any) -> None:
    if event == DISK_HIT_EVENT:
        _state().disk_hit = True


def _on_duration(event: str, seconds: float, **kwargs: Any) -> None:
    state = _state()
    if event == _FRONTEND[0]:
        # nested jits (a fused segment's per-op programs) report their traces inside the outer one's:
        # the outermost trace, the longest, already includes them
        state.trace = max(state.trace, seconds)
        return
    if event in _FRONTEND:
        state.frontend += seconds
        return
    if event != BACKEND_COMPILE_EVENT:
        return
    total, from_disk = seconds + state.frontend + state.trace, state.disk_hit
    state.frontend, state.trace, state.disk_hit = 0.0, 0.0, False
    state.xla_compiles += not from_disk
    _record(sys._getframe(1), kwargs.get("fun_name", "?"), total, from_disk)


def _record(frame, fallback_name: str, seconds: float, from_disk: bool) -> None:
    given = getattr(_local, "attribution", None)
    if given is not None:  # a background compile (compile_ahead): named where its op was issued
        op, shapes, where_text, source = given
        record_xla_compile(op, shapes, seconds + _local.frontend_elsewhere, from_disk, where_text, source)
        return
    op, shapes = attribute(frame, fallback_name)
    where = user_frame(2)
    record_xla_compile(op, shapes, seconds, from_disk, f"{where[0]}:{where[1]}" if where else "",
                       where[3] if where else "")


@contextlib.contextmanager
def lowering_elsewhere() -> Iterator[list]:
    """A block that traces and lowers a program another thread compiles: its tracing/lowering seconds
    are handed over (the yielded list's item) instead of being added to this thread's next compile."""
    state = _state()
    saved = state.frontend, state.trace
    state.frontend = state.trace = 0.0
    spent = [0.0]
    try:
        yield spent
    finally:
        spent[0] = state.frontend + state.trace
        state.frontend, state.trace = saved


@contextlib.contextmanager
def attributed(attribution: tuple, frontend_s: float) -> Iterator[None]:
    """This thread's compiles are reported as (op, shapes, file:line, source), with ``frontend_s``
    seconds of tracing and lowering done elsewhere added."""
    _local.attribution, _local.frontend_elsewhere = attribution, frontend_s
    try:
        yield
    finally:
        _local.attribution = None


def record_load(seconds: float, fallback_name: str) -> None:
    """A program loaded from program_store (no JAX compile event announces it): a disk hit."""
    _record(sys._getframe(1), fallback_name, seconds, True)


@contextlib.contextmanager
def tracing_only() -> Iterator[None]:
    """A block that traces without compiling (fused mode's jax.eval_shape of a new step): its
    tracing time is not added to the next compile, which may happen cells later."""
    with lowering_elsewhere():
        yield


def _shapes(values) -> str:
    parts = []
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append(f"{tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(t, torch.Tensor) for t in v):
            parts.append(f"[{len(v)} tensors]")
    return ", ".join(parts)


def attribute(frame, fallback_name: str) -> tuple[str, str]:
    """(what compiled, its inputs) from the innermost dispatch kernel or compiled graph on the stack."""
    named = None  # an op named by a helper frame that does not hold the call's arguments (compile_ahead.call)
    while frame is not None:
        if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            local = frame.f_locals
            op_name = local.get("op_name")
            if isinstance(op_name, str) and "::" in op_name:
                if local.get("args") is not None:
                    return op_name, _shapes(local["args"])
                named = named or op_name
                frame = frame.f_back
                continue
            owner = local.get("self")
            label = getattr(owner, "compile_label", None)
            if isinstance(label, str):  # an op a segment runs op by op is named as the op it is
                return (named, "") if named else (label, _shapes(local.get("args") or local.get("batch") or ()))
        frame = frame.f_back
    return (named, "") if named else (f"jax function {fallback_name}", "")


_installed = False


# XLA:CPU's MLIR fusion emitters take about twice as long as its older emitters to compile the small
# programs eager mode makes one of per new op/shape (measured here: 4.9 s -> 2.8 s of backend compile for
# 40 programs); the generated code is equivalent. Only XLA:CPU reads the flag, and only when its client
# starts, so it is set before the first array exists and only on jax releases known to have it (an
# unknown XLA flag aborts the process). Opt out: TPU_INTERACTIVE_XLA_CPU_FAST_COMPILE=0.
FAST_CPU_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"


# XLA:CPU in jaxlib 0.10 hands some dot + reduce fusions to YNNPACK ("__ynn_fusion"), which computes
# sum(dot(broadcast(s), broadcast(s).T)) at shape (64, 31) as inf or 1e37 instead of 126976 (found by the
# fused eager mode, whose programs contain `torch.ones(...) @ ...`; jax 0.6.2 is correct). An empty list
# switches those fusions off. A correctness flag: not covered by the fast-compile opt-out.
NO_YNN_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
_YNN_SINCE = "0.10.0"  # the oldest jax tested to have the flag (0.6.2 does not: an unknown flag aborts)


def fast_cpu_compile() -> bool:
    """Add this package's XLA:CPU flags if they can still take effect; True if the fast-compile one
    was added."""
    from packaging.version import Version

    from .versions import TESTED_JAX

    flags = os.environ.get("XLA_FLAGS", "")
    version = Version(jax.__version__)
    from jax._src import xla_bridge

    initialized = getattr(xla_bridge, "backends_are_initialized", lambda: True)
    if initialized():  # too late: the CPU client has read its flags
        return False
    added = []
    if "xla_cpu_experimental_ynn_fusion_type" not in flags and Version(_YNN_SINCE) <= version:
        added.append(NO_YNN_FUSION_FLAG)
    fast = (os.environ.get("TPU_INTERACTIVE_XLA_CPU_FAST_COMPILE", "1") != "0" and "xla_cpu_use_fusion_emitters" not in flags
            and Version(TESTED_JAX[0]) <= version <= Version(TESTED_JAX[-1]))
    if fast:
        added.append(FAST_CPU_COMPILE_FLAG)
    if added:
        os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
    return fast


def install() -> None:
    """Listen to JAX's compile events (once per process) and turn on the persistent cache."""
    global _installed
    if not _installed:
        jax.monitoring.register_event_listener(_on_event)
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _installed = True
    follow_persistent_cache_config()


# ---------------------------------------------------------------- the persistent compilation cache
_persistent_dir: list = [None]
_warned_dirs: set = set()


def _usable(directory: str) -> bool:
    """The directory exists (or can be made) and takes a file; otherwise warn once and run uncached."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".probe-{os.getpid()}")
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
        return True
    except OSError as exc:
        if directory not in _warned_dirs:
            _warned_dirs.add(directory)
            warnings.warn(f"tpu_interactive: the persistent compilation cache directory {directory!r} is not "
                          f"writable ({exc.strerror or exc}); compiling without it. Set TPU_INTERACTIVE_CACHE_DIR "
                          "to another directory, or to an empty value to turn the cache off.",
                          RuntimeWarning, stacklevel=3)
        return False


def trim(directory: str, max_bytes: int) -> int:
    """Delete the least recently used cache entries until the directory holds at most ``max_bytes``
    (down to 80% of it, so trimming is rare); returns the number of entries deleted.

    JAX's own size cap (``jax_compilation_cache_max_size``) is not used: it lists, stats and reads every
    entry's access-time file on each write, which made every new compile O(entries) — a cold test suite
    with 7,600 entries spent most of its time there. Trimming once when the cache is switched on is
    O(entries) once per process; recency is the file's access (or, on noatime mounts, write) time.
    """
    entries, total = [], 0
    with os.scandir(directory) as listing:
        for entry in listing:
            if entry.name.endswith("-cache") and entry.is_file():
                info = entry.stat()
                entries.append((max(info.st_atime, info.st_mtime), info.st_size, entry.path))
                total += info.st_size
    if total <= max_bytes:
        return 0
    deleted = 0
    for _, size, path in sorted(entries):
        if total <= 0.8 * max_bytes:
            break
        for stale in (path, path[: -len("-cache")] + "-atime"):  # -atime: written by JAX's own cap, if ever used
            try:
                os.remove(stale)
            except OSError:
                pass
        total -= size
        deleted += 1
    return deleted


def _point_jax_at(directory: str | None) -> None:
    from jax._src import compilation_cache  # reset_cache: re-point a cache JAX already initialised

    jax.config.update("jax_compilation_cache_dir", directory)
    if directory:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # eager ops' small programs too
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        jax.config.update("jax_compilation_cache_max_size", -1)  # no per-write scan; see trim()
        trim(directory, config.persistent_cache_max_bytes)
    compilation_cache.reset_cache()
    _persistent_dir[0] = directory


def follow_persistent_cache_config() -> None:
    """Point JAX at ``config.persistent_cache_dir`` if it changed (called at start and before compiles)."""
    directory = config.persistent_cache_dir or None
    if directory is not None and not _usable(directory):
        directory = None
    if directory != _persistent_dir[0]:
        _point_jax_at(directory)


def persistent_cache_dir() -> str | None:
    """The directory JAX's persistent compilation cache uses now (None: off)."""
    return _persistent_dir[0]


def disable_persistent_cache() -> None:
    config.persistent_cache_dir = None
    if _persistent_dir[0] is not None:
        _point_jax_at(None)
