"""Platform choice and padding helpers shared by the Pallas kernels."""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=1)
def platform() -> str:
    """'tpu', 'gpu' or 'cpu': which kernel family to use (CPU runs Pallas in interpret mode)."""
    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def interpret() -> bool:
    return platform() not in ("tpu", "gpu")


def x32():
    """A context to trace a Pallas kernel in with 64-bit types off. The backend enables
    ``jax_enable_x64`` (torch's int64/float64), under which a literal block index such as the 0 in
    ``lambda i: (i, 0)`` is traced as int64, and Mosaic rejects index maps returning int64 (a TPU v5e:
    "failed to legalize operation 'func.return' ... (i32, i64)"). Kernel operands are 32-bit or less.
    Only for Mosaic: interpret mode (CPU) and Triton take int64 indices, and on jax < 0.7 interpret
    mode breaks when the kernel is traced with x64 off but discharged with it on."""
    if platform() != "tpu":
        return contextlib.nullcontext()
    return jax.enable_x64(False)


def available() -> bool:
    """Whether the kernels run here: on TPU they need jax >= 0.7, whose ``jax.enable_x64`` switches
    x64 off inside a trace (jax 0.6's ``disable_x64`` there leaves int64 and int32 mixed in one
    module). Elsewhere the Pallas switch routes to the XLA lowerings."""
    return platform() != "tpu" or hasattr(jax, "enable_x64")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """Pad ``x`` along ``axis`` to ``size`` (ragged shapes become whole blocks)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def with_reference_vjp(kernel, reference):
    """``kernel`` (arrays in, array or tuple out) with its backward pass taken from the XLA
    ``reference`` (same signature): for kernels that have no backward of their own. Bind static
    arguments with functools.partial first."""
    fn = jax.custom_vjp(kernel)

    def fwd(*args):
        return kernel(*args), args

    def bwd(args, g):
        _, vjp = jax.vjp(reference, *args)
        return vjp(g)

    fn.defvjp(fwd, bwd)
    return fn
