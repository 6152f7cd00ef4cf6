"""The `tpu` torch device on JAX/XLA. Knows nothing of IPython."""
from __future__ import annotations

from . import compile_log, jax_runtime

compile_log.fast_cpu_compile()  # XLA flags: before anything starts a jax backend
jax_runtime.join_from_env()  # under torchrun: join JAX's multi-process runtime before the XLA backend starts

from . import dtypes  # noqa: E402,F401  (enables jax x64 before any array exists)
from ._register import register  # noqa: E402
from .config import config, cpu_fallback, nan_check, pallas, sync_mode  # noqa: E402
from .fusion import fuse  # noqa: E402
from .info import backend_info, memory_stats  # noqa: E402
from .rng import default_generator  # noqa: E402

register()

compile_log.install()  # count every XLA compile; JAX's persistent compilation cache on

from .compiler import install_dynamo_hook  # noqa: E402  (backend="tpu" for torch.compile, lazily)

install_dynamo_hook()

from . import c10d  # noqa: E402

c10d.register()  # dist.init_process_group("tpu"), the default backend for tpu tensors

from . import accelerate_guard  # noqa: E402

accelerate_guard.install()  # Accelerate's multi-process runs on tpu would not synchronize: refused

__all__ = ["config", "sync_mode", "fuse", "nan_check", "pallas", "cpu_fallback", "backend_info", "memory_stats",
           "default_generator"]
