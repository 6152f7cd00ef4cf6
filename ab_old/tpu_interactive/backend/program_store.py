"""Eager ops' compiled programs on disk, found again without tracing or lowering.

JAX's persistent cache keys an executable by its lowered module, so a second process still traces
and lowers every eager op's program before the cache can answer: measured on the 2-core box, ~9 ms
of the ~12 ms each of the 79 programs of a first training step cost with the cache warm. This store
keys a program by what decides it before tracing: the program's stable name (its lowering's module,
qualified name and closure, or a name its builder gives), the static arguments it was specialised
on, the input avals and shardings, the donated inputs, and a *base* of everything else that could
change the compiled code: this package's source, the jax/jaxlib/torch versions, the backend and its
devices, XLA's environment flags, the host CPU's model and flags, jax's config and this package's. A hit is a deserialized
executable (``jax.experimental.serialize_executable``), ~1.5 ms instead of trace + lower + cache
read. Anything the key cannot describe exactly (an object without a stable text form) is simply
not stored: such a program compiles through jax as before. The entries live in the persistent
cache directory (named ``tpu-…-cache``, so compile_log.trim's size cap covers them); an unreadable
entry is deleted and its program compiled again.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import math
import os
import pickle
import tempfile
import types
import warnings
from typing import Any, Callable

import jax
import numpy as np
import torch
from jax._src import config as jax_config  # its thread-local settings: no public form

from . import compile_log
from .config import config

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_warned: list = [False]
COUNTS = {"stored": 0, "loaded": 0, "unstable": 0}


class Unstable(Exception):
    """A value with no text form that is the same in every process (so no key can name it)."""


def function_name(fn: Callable) -> str:
    """A function's name across processes: its module, qualified name and, for a closure or a
    function with defaults, the stable form of what it closes over (Unstable otherwise)."""
    if isinstance(fn, functools.partial):
        return f"partial({function_name(fn.func)}, {stable(fn.args)}, {stable(fn.keywords)})"
    named = getattr(fn, "program_name", None)
    if isinstance(named, str):
        return named
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<lambda>" in qualname:
        raise Unstable(repr(fn))
    name = f"{module}.{qualname}"
    if isinstance(fn, types.FunctionType):
        cells = tuple(c.cell_contents for c in fn.__closure__ or ())
        if cells or fn.__defaults__ or fn.__kwdefaults__:
            name += f"[{stable(cells)}|{stable(fn.__defaults__)}|{stable(fn.__kwdefaults__)}]"
    elif "<locals>" in qualname:  # a callable object made inside a function: its state is unknown
        raise Unstable(repr(fn))
    return name


def stable(value: Any) -> str:
    """``value``'s text form, the same in every process; Unstable where there is none."""
    t = type(value)
    if value is None or t in (bool, int, str, bytes, type(Ellipsis)):
        return repr(value)
    if t is float:
        return float.hex(value)
    if t in (tuple, list, torch.Size):
        return f"{t.__name__}({', '.join(stable(v) for v in value)})"
    if t is dict:
        return "{" + ", ".join(f"{stable(k)}: {stable(v)}" for k, v in value.items()) + "}"
    if t in (torch.dtype, torch.device, torch.layout, torch.memory_format) or isinstance(value, enum.Enum):
        return f"{t.__name__}:{value}"
    if isinstance(value, np.dtype):  # its class is a subclass per dtype (numpy.dtypes.Float32DType)
        return f"dtype:{value.name}{value.str}"  # the name tells bfloat16 from other 2-byte kinds
    if isinstance(value, type):
        if issubclass(value, np.generic):  # jnp.float32 and friends
            return f"scalar:{np.dtype(value)}"
        return f"type:{value.__module__}.{value.__qualname__}"
    if t is slice:
        return f"slice({stable(value.start)}, {stable(value.stop)}, {stable(value.step)})"
    describe = getattr(value, "__stable__", None)  # op_jit's _Seq, specs, registry.Lowering
    if describe is not None:
        return f"{t.__qualname__}({describe()})"
    if callable(value):
        return function_name(value)
    raise Unstable(f"{t.__module__}.{t.__qualname__}")


def _source_digest() -> bytes:
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(_PACKAGE_ROOT):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".py", ".cpp")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, _PACKAGE_ROOT).encode())
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.digest()


def host_cpu() -> str:
    """The host CPU's model and instruction-set flags: XLA:CPU compiles for the CPU it runs on, and a
    cache directory shared by hosts of different CPUs (an NFS home) must not hand one host's machine
    code to another (an illegal instruction)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            fields = dict(line.split(":", 1) for line in handle.read().split("\n\n")[0].splitlines() if ":" in line)
        identity = [fields.get(k, "").strip() for k in ("model name", "flags", "Features", "CPU implementer", "CPU part")]
        return hashlib.sha256(repr(identity).encode()).hexdigest()
    except OSError:  # not Linux
        import platform

        return f"{platform.machine()} {platform.processor()}"


@functools.lru_cache(maxsize=1)
def _environment() -> str:
    """What stays fixed for the process: source, versions, backend and devices, XLA's flags, the host CPU."""
    import jaxlib
    from jax._src import xla_bridge

    backend = xla_bridge.get_backend()
    devices = [(d.id, d.process_index, d.device_kind, d.platform) for d in jax.devices()]
    return repr((_source_digest().hex(), jax.__version__, jaxlib.__version__, torch.__version__,
                 backend.platform, backend.platform_version, devices, jax.process_index(), jax.process_count(),
                 os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""), host_cpu()))


def _settings() -> str:
    """jax's config, this package's and torch's defaults a lowering may read (they may change between
    calls, so they are read each time a key is made)."""
    values = [f"torch.default_dtype={torch.get_default_dtype()}",
              f"torch.matmul_precision={torch.get_float32_matmul_precision()}"]
    values += [_setting(name, value) for name, value in sorted(getattr(jax.config, "values", {}).items())]
    values += [_setting(f"tpu.{name}", value) for name, value in sorted(vars(config).items()) if not name.startswith("_")]
    # jax's thread-local settings (``with jax.default_matmul_precision(...)`` around the torch code)
    from jax._src import config as jax_config

    values += [_setting(f"trace.{i}", value) for i, value in enumerate(jax_config.trace_context())]
    return ";".join(values)


def _setting(name: str, value: Any) -> str:
    try:
        return f"{name}={stable(value)}"
    except Unstable:  # a callback or handle: its type at least
        return f"{name}=?{type(value).__qualname__}"


def directory() -> str | None:
    """Where entries go: the persistent cache directory, when it is on."""
    return compile_log.persistent_cache_dir()


def _path(folder: str, name: str, static: tuple, signature: tuple, donate: int) -> str | None:
    try:
        text = f"{name}\n{stable(static)}\n{_signature_text(signature)}\n{donate}"
    except Unstable:
        COUNTS["unstable"] += 1
        return None
    digest = hashlib.sha256(f"{_environment()}\n{_settings()}\n{text}".encode()).hexdigest()
    return os.path.join(folder, f"tpu-{digest}-cache")


def _signature_text(signature: tuple) -> str:
    return ";".join("None" if item is None else f"{item[0].str_short()}/{item[0].weak_type}/{item[1]}/{item[2]}"
                    for item in signature)


def load(name: str | None, static: tuple, signature: tuple, donate: int) -> tuple[Callable | None, str | None]:
    """(the stored executable or None, the path it is stored at or None when it cannot be stored)."""
    folder = directory()
    if folder is None or name is None:
        return None, None
    path = _path(folder, name, static, signature, donate)
    if path is None or not os.path.exists(path):
        return None, path
    from jax.experimental import serialize_executable

    _prepare_custom_calls()
    try:
        with open(path, "rb") as handle:
            device_id, (payload, in_tree, out_tree) = pickle.load(handle)
        devices = [d for d in jax.devices() if d.id == device_id]
        executable = serialize_executable.deserialize_and_load(payload, in_tree, out_tree, execution_devices=devices)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign entry: compile instead
        _warn(f"could not read the stored program {path} ({type(exc).__name__}: {exc}); compiling it again")
        try:
            os.remove(path)
        except OSError:
            pass
        return None, path
    COUNTS["loaded"] += 1
    return executable, path


@functools.lru_cache(maxsize=1)
def _prepare_custom_calls() -> None:
    """Fill in what jax's linalg lowerings set up as they lower: the LAPACK function table its CPU
    custom calls (getrf, gesdd, geev, ...) call through, and the GPU solvers' hybrid kernels. A stored
    program skips lowering, so without this its first LAPACK call in a new process jumps through a
    null pointer (a segfault, seen on the first ``torch.linalg.inv`` of a process with a warm store)."""
    from jax._src.lib import lapack  # what jax's own lowering calls (prepare_lapack_call), jax 0.6 to 0.10

    initialize = getattr(getattr(lapack, "_lapack", None), "initialize", None)
    if initialize is not None:
        initialize()
    if jax.default_backend() == "gpu":
        from jax._src.lib import gpu_solver

        initialize = getattr(gpu_solver, "initialize_hybrid_kernels", None)
        if initialize is not None:
            initialize()


def compile_and_store(lowered: Any, path: str | None) -> Any:
    """``lowered.compile()``, stored at ``path`` when XLA itself compiled it just now
    (compile_log.xla_compiles moved during it). An executable read from JAX's persistent cache
    serializes without its compiled functions (on XLA:CPU; loading it then fails at its first run with
    "Function ... not found"), and one jax hands back from memory may have been read so: neither is
    stored; the program keeps coming from JAX's cache."""
    compiles = compile_log.xla_compiles()
    # a program this store keeps (one device's: _save) is not also written to JAX's cache (a second
    # serialization and a compressed copy, ~1.3 ms each on XLA:CPU): a later process finds it here first
    kept_here = path is not None and _one_device(lowered)
    with jax_config.persistent_cache_min_compile_time_secs(math.inf) if kept_here else contextlib.nullcontext():
        compiled = lowered.compile()
    if compile_log.xla_compiles() > compiles:
        _save(path, compiled)
    return compiled


def _one_device(lowered: Any) -> bool:
    """``lowered`` compiles for one device (unknown: False)."""
    return getattr(getattr(lowered, "_lowering", None), "compile_args", {}).get("num_devices") == 1


def _save(path: str | None, compiled: Any) -> None:
    if path is None:
        return
    from jax.experimental import serialize_executable

    devices = {d for sharding in jax.tree.leaves(compiled.output_shardings) for d in sharding.device_set}
    if len(devices) != 1:  # eager programs run on one device; a multi-device one is compiled as before
        return
    try:
        blob = pickle.dumps((devices.pop().id, serialize_executable.serialize(compiled)))
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tpu-")
        with os.fdopen(handle, "wb") as out:
            out.write(blob)
        os.replace(temporary, path)  # readers see a whole entry or none
    except Exception as exc:  # noqa: BLE001 - an executable that cannot be serialized, a full disk
        _warn(f"could not store a compiled program ({type(exc).__name__}: {exc}); it stays in memory only")
        return
    COUNTS["stored"] += 1


def _warn(message: str) -> None:
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(f"tpu_interactive: {message}", RuntimeWarning, stacklevel=4)
