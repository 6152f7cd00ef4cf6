"""torch <-> jax dtype mapping and the 64-bit policy.

Policy: the backend enables ``jax_enable_x64`` when it starts, so int64/float64/complex128 tensors
keep their width exactly as on CPU PyTorch (JAX would otherwise silently truncate them to 32 bits).
Default dtypes still follow torch (float32 unless ``torch.set_default_dtype`` says otherwise),
because every result dtype is taken from torch's own meta kernels, not from JAX's promotion.
Note that on a real TPU, 64-bit types are emulated and slow; prefer float32/bfloat16 and int32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

jax.config.update("jax_enable_x64", True)

TORCH_TO_JAX: dict[torch.dtype, jnp.dtype] = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}

# numpy has no bfloat16/float8: cross the host boundary as same-width integers and reinterpret.
_BITCAST_VIA = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.int8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.int8, ml_dtypes.float8_e5m2),
}


class UnsupportedDtypeError(TypeError):
    pass


def to_jax(dtype: torch.dtype):
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} is not supported on the tpu device "
            f"(supported: {', '.join(str(d).replace('torch.', '') for d in TORCH_TO_JAX)})"
        ) from None


def cast(value, jt):
    """``value`` as the jax dtype ``jt``, as torch casts: complex to real keeps the real part (jax's
    ``astype`` deprecates that cast and will refuse it)."""
    if jnp.iscomplexobj(value) and not jnp.issubdtype(jt, jnp.complexfloating):
        value = jnp.real(value)
    return value.astype(jt)


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy array with the tensor's exact bits (t must be a CPU tensor)."""
    via = _BITCAST_VIA.get(t.dtype)
    if via is not None:
        return t.view(via[0]).numpy().view(via[1])
    return t.numpy()


def numpy_to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True, order="C")  # torch.from_numpy wants a writable buffer
    via = _BITCAST_VIA.get(dtype)
    if via is not None:
        return torch.from_numpy(a.view(np.dtype(f"int{a.dtype.itemsize * 8}"))).view(dtype)
    return torch.from_numpy(a)  # (np.ascontiguousarray would turn a 0-dim array into shape (1,))


# ATen's ScalarType names, the words its error messages use
SCALAR_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
                torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble"}


def scalar_name(dtype: torch.dtype) -> str:
    """ATen's ScalarType name ("Float", "Long", ...), the word its error messages use."""
    return SCALAR_NAMES.get(dtype, str(dtype))
