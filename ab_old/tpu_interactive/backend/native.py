"""The C++ half of the device (csrc/tpu_native.cpp), built on first use and cached.

Torch looks up a PrivateUse1 backend's allocator, pinned memory, generators, device
synchronisation and events only in C++ (``torch._C._acc.PrivateUse1Hooks`` exposes three Python
methods). ``install()`` JIT-builds a small extension with ``torch.utils.cpp_extension.load`` (cached
under ``TORCH_EXTENSIONS_DIR``, per torch version, rebuilt when a source changes; the first build takes a
minute; builds and loads are serialized by :func:`build_lock`, so a killed import's lock file never
blocks the next) and registers its hooks before torch's Python ones. Without a C++ compiler the package still
imports; :func:`require` then raises naming the cause for the calls that need the extension.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from types import ModuleType

import torch

from . import stats

_SOURCES = [os.path.join(os.path.dirname(__file__), "csrc", name)
            for name in ("tpu_native.cpp", "fast_dispatch.cpp", "python_front.cpp",
                         "boxed_front.cpp", "fused_record.cpp", "memory_counters.cpp")]
_module: ModuleType | None = None
_error: str | None = None


class TPUNativeUnavailableWarning(UserWarning):
    pass


class _Callbacks:
    """What the C++ hooks call: the same functions torch.tpu uses, so both report equal numbers."""

    @staticmethod
    def synchronize() -> None:
        torch.tpu.synchronize()

    @staticmethod
    def empty_cache() -> None:
        torch.tpu.empty_cache()

    @staticmethod
    def device_stats() -> tuple:
        c = stats.memory_totals()
        reserved = torch.tpu.memory_reserved()
        return ((c.live_bytes, c.peak_bytes, c.allocated_bytes, c.freed_bytes),
                (c.live_buffers, c.peak_buffers, c.allocations, c.frees),
                (reserved, max(reserved, torch.tpu.max_memory_reserved()), 0, 0))

    @staticmethod
    def reset_peak_stats() -> None:
        torch.tpu.reset_peak_memory_stats()

    @staticmethod
    def reset_accumulated_stats() -> None:
        stats.reset_accumulated()

    @staticmethod
    def mem_get_info() -> tuple[int, int]:
        return torch.tpu.mem_get_info()

    @staticmethod
    def resize_storage(raw: torch.UntypedStorage, nbytes: int) -> int:
        from .storage_resize import resize

        return resize(raw, nbytes)


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None:  # pip's ninja (a dependency) outside an activated venv
        try:
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass

    version = torch.__version__.replace(".", "_").replace("+", "_")
    name = f"tpu_interactive_native_{version}"
    with build_lock(cpp_extension._get_build_directory(name, verbose=False)):
        return cpp_extension.load(name=name, sources=_SOURCES, extra_cflags=["-O2"], verbose=False)


def _wait_for_flock(fd: int, build_dir: str, quiet_s: float) -> None:
    """Take the flock on ``fd``; a wait past ``quiet_s`` (a build, not another rank's load) is told."""
    deadline = time.monotonic() + quiet_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    warnings.warn(f"waiting for another process building tpu_interactive's torch hooks in {build_dir}",
                  TPUNativeUnavailableWarning, stacklevel=5)
    fcntl.flock(fd, fcntl.LOCK_EX)


@contextlib.contextmanager
def build_lock(build_dir: str, quiet_s: float = 5.0) -> Iterator[None]:
    """Hold this package's lock on ``build_dir`` while torch builds or loads the extension there.

    Every ``cpp_extension.load`` takes torch's lock file (even to find the build up to date) and waits
    forever on one it finds. A process killed holding it (a launcher stopping a rank mid-import, a
    kernel restarted during its first build) left it behind, and every later import hung. Ours is an
    ``flock``, which the kernel releases when its holder dies; whoever holds it is the only import in
    ``load``, so a torch lock file it finds was left by a dead one and is removed."""
    os.makedirs(build_dir, exist_ok=True)
    fd = os.open(os.path.join(build_dir, "tpu_interactive.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _wait_for_flock(fd, build_dir, quiet_s)
        try:
            os.remove(os.path.join(build_dir, "lock"))  # left by a killed import, if there
        except FileNotFoundError:
            pass
        yield
    finally:
        os.close(fd)  # releases the flock


def install() -> bool:
    """Build (or load the cached build) and register the hooks; False, with a warning, if that fails."""
    global _module, _error
    if _module is not None:
        return True
    module = None
    if _compiler() is None:
        _error = ("no C++ compiler found (install g++, e.g. `apt-get install -y g++`, or set CXX); "
                  "tpu_interactive builds its torch hooks with torch.utils.cpp_extension")
    else:
        try:
            module = _build()
        except Exception as exc:  # noqa: BLE001 - any build failure leaves the pure-Python backend
            _error = f"building tpu_interactive's torch hooks failed: {exc}"
    if module is not None:
        if module.install(_Callbacks()):
            _module = module
            return True
        _error = "PrivateUse1 hooks were already registered before tpu_interactive's"
    warnings.warn(f"{_error}. Pinned memory, torch.Generator(device='tpu'), torch.Event/torch.tpu.Event "
                  "timing need them; torch.accelerator's memory calls fall back to torch.tpu's.",
                  TPUNativeUnavailableWarning, stacklevel=3)
    _accelerator_through_python()
    return False


_ACCELERATOR_CALLS = ("empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
                      "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                      "reset_accumulated_memory_stats", "synchronize")


def _accelerator_through_python() -> None:
    """Without the C++ allocator and device guard, torch.accelerator's memory calls and synchronize
    fail inside torch (Accelerate calls empty_cache on every run): answer them from torch.tpu."""
    import torch.accelerator as acc
    import torch.accelerator.memory as acc_memory

    def through(name, original):
        def call(*args, **kwargs):
            if torch.accelerator.current_accelerator() == torch.device("tpu"):
                return getattr(torch.tpu, name)(*args, **kwargs)
            return original(*args, **kwargs)

        call.__doc__ = original.__doc__
        return call

    for name in _ACCELERATOR_CALLS:
        wrapped = through(name, getattr(acc, name))
        setattr(acc, name, wrapped)
        if hasattr(acc_memory, name):
            setattr(acc_memory, name, wrapped)
    info = through("mem_get_info", acc.get_memory_info)
    acc.get_memory_info = acc_memory.get_memory_info = info


def module() -> ModuleType | None:
    """The built extension (None without it)."""
    return _module


def available() -> bool:
    return _module is not None


def require(what: str) -> None:
    """Raise naming the cause when ``what`` needs the C++ hooks and they are not installed."""
    if _module is None:
        raise RuntimeError(f"{what} needs tpu_interactive's C++ torch hooks, which are not installed: {_error}")


def elapsed_time(start: torch.Event, end: torch.Event) -> float:
    assert _module is not None
    return float(_module.elapsed_time(start, end))


def is_pinned_ptr(ptr: int) -> bool:
    return _module is not None and bool(_module.is_pinned_ptr(ptr))


__all__ = ["TPUNativeUnavailableWarning", "available", "elapsed_time", "install", "is_pinned_ptr", "require"]
