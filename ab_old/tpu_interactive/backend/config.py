"""Runtime switches of the backend.

Settings read from the environment (``TPU_LAUNCH_BLOCKING``, ``TPU_INTERACTIVE_*``) are applied once,
when the backend starts; ``config`` attributes can be changed at any time afterwards.
"""
from __future__ import annotations

import dataclasses
import os


def _env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _cache_dir_from_env() -> str | None:
    """TPU_INTERACTIVE_CACHE_DIR if set (empty: off), else $XDG_CACHE_HOME/tpu_interactive/jax."""
    value = os.environ.get("TPU_INTERACTIVE_CACHE_DIR")
    if value is not None:
        return value.strip() or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tpu_interactive", "jax")


_listeners: list = []


def add_listener(callback) -> None:
    """Call ``callback()`` after every change of a ``config`` attribute (the C++ fast path keeps a
    copy of the switches it depends on)."""
    _listeners.append(callback)


@dataclasses.dataclass
class Config:
    # Block on every op's result so runtime errors surface at the op that caused them.
    sync: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_LAUNCH_BLOCKING"))
    # Check every floating op result for NaN/Inf (implies a sync per op).
    nan_check: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_INTERACTIVE_NAN_CHECK"))
    # Ops with no lowering run on CPU (copy in, run, copy back) with a one-time warning.
    cpu_fallback: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_INTERACTIVE_CPU_FALLBACK", True))
    # Route hot ops (attention, norms, softmax, matmul) to Pallas kernels.
    pallas: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_INTERACTIVE_PALLAS", False))
    # Plain tensors' op calls already run as one jitted program each (the C++ fast path, fast_path.py);
    # this runs the other calls (views, lazy conj/neg bits) that way too instead of primitive by primitive.
    jit_ops: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_INTERACTIVE_JIT_OPS", False))
    # Compile ahead (compile_ahead.py): an eager op whose program is cold runs later, its XLA compile
    # on one of `compile_threads` background threads, so the next cold ops' compiles overlap it.
    compile_ahead: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_INTERACTIVE_COMPILE_AHEAD", True))
    compile_threads: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("TPU_INTERACTIVE_COMPILE_THREADS", max(2, os.cpu_count() or 1))))
    # Fused eager mode (fusion.py): record ops and run each segment as one jitted program.
    fuse: bool = dataclasses.field(default_factory=lambda: _env_flag("TPU_DEFER_AND_FUSE"))
    # A segment is run after this many recorded ops (bounds host memory and compile time).
    fuse_max_ops: int = dataclasses.field(default_factory=lambda: int(os.environ.get("TPU_FUSE_MAX_OPS", 10_000)))
    # ... or when an op ends a chain of this many dependent recorded ops: XLA:CPU emits an elementwise
    # chain by recursion on a compile thread, and ~7,000 chained `x.add_(1)` overflowed its stack
    # (a segfault); a barrier inside the program does not help, XLA:CPU drops those.
    fuse_max_depth: int = dataclasses.field(default_factory=lambda: int(os.environ.get("TPU_FUSE_MAX_DEPTH", 512)))
    # Programs compiled per op sequence (recorded from one line) with different shapes/arguments;
    # further variants run op by op (a shape-changing loop such as generate() must not compile per step).
    fuse_variants: int = 2
    # A segment's program takes the memory of the arrays it overwrites and nothing else holds (a
    # parameter's or a moment's old value): no second copy of the model while it runs. None: arrays of
    # 1 MiB or more, not on XLA:CPU (whose donating programs run slower: a d 256 block's fused step
    # 23.5 -> 26 ms here, and host memory is plenty); TPU_FUSE_DONATE=1 (any size) or 0 forces it.
    fuse_donate: bool | None = dataclasses.field(
        default_factory=lambda: _env_flag("TPU_FUSE_DONATE") if "TPU_FUSE_DONATE" in os.environ else None)
    # Optional cap on live device bytes (simulates a small device; None = the device's own limit).
    memory_limit_bytes: int | None = None
    # Directory of JAX's persistent compilation cache, on by default under the user's cache directory
    # (a second process then loads its programs instead of compiling them); None or "" = off.
    persistent_cache_dir: str | None = dataclasses.field(default_factory=lambda: _cache_dir_from_env())
    # Size cap of that cache (least recently used entries are deleted when the cache is switched on).
    persistent_cache_max_bytes: int = dataclasses.field(
        default_factory=lambda: int(os.environ.get("TPU_INTERACTIVE_CACHE_MAX_BYTES", 4 << 30)))

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        for callback in _listeners:
            callback()


config = Config()

# Settings that only take effect when the JAX backend initialises (reported by backend_info()).
STARTUP_ONLY_ENV = ("JAX_PLATFORMS", "XLA_FLAGS", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "JAX_ENABLE_X64")


class _Switch:
    """``sync_mode(True)`` sets the flag; ``with sync_mode(True):`` sets it for a block only."""

    def __init__(self, field: str):
        self._field = field

    def __call__(self, enabled: bool | None = None):
        if enabled is None:
            return getattr(config, self._field)
        previous = getattr(config, self._field)
        setattr(config, self._field, bool(enabled))
        return _Restorer(self._field, previous)


class _Restorer:
    def __init__(self, field: str, previous: bool):
        self._field, self._previous = field, previous

    def __enter__(self):
        return config

    def __exit__(self, *exc):
        setattr(config, self._field, self._previous)
        return False

    def __bool__(self) -> bool:
        return bool(getattr(config, self._field))

    def __repr__(self) -> str:
        return f"{self._field}={getattr(config, self._field)}"


sync_mode = _Switch("sync")
nan_check = _Switch("nan_check")
pallas = _Switch("pallas")
cpu_fallback = _Switch("cpu_fallback")
