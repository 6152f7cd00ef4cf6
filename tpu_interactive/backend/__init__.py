"""The `tpu` torch device on JAX/XLA. Knows nothing of IPython."""
from __future__ import annotations

from . import jax_runtime

jax_runtime.join_from_env()  # under torchrun: join JAX's multi-process runtime before the XLA backend starts

from . import dtypes  # noqa: F401  (enables jax x64 before any array exists)
from ._register import register
from .config import config, cpu_fallback, nan_check, pallas, sync_mode
from .info import backend_info, memory_stats
from .rng import default_generator

register()

from . import compile_log  # noqa: E402

compile_log.install()  # count every XLA compile; JAX's persistent compilation cache on

from .compile import install_dynamo_hook  # noqa: E402  (backend="tpu" for torch.compile, lazily)

install_dynamo_hook()

from . import c10d  # noqa: E402

c10d.register()  # dist.init_process_group("tpu"), the default backend for tpu tensors

__all__ = ["config", "sync_mode", "nan_check", "pallas", "cpu_fallback", "backend_info", "memory_stats",
           "default_generator"]
