"""Complex tensors: dtype-changing views (view_as_real / view_as_complex), construction, angle, conj.

``view_as_real(c)`` and ``view_as_complex(r)`` are real aliases, as on CPU: torch's own metadata
kernels make a tensor of the other dtype over the *same* storage, and ``storage.read``/``write``
reinterpret the buffer's bytes (complex64 <-> float32 pairs). ``c.real`` / ``c.imag`` are
``view_as_real(c).select(-1, k)`` in torch, so writes through them update ``c``. Lazy conjugate and
negative bits (``c.conj()``, ``c.conj().imag``) are applied by ``storage.read``/``write``.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import dtypes, storage
from ..registry import lower
from ..replay import cpu_error

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_aten = torch.ops.aten


# ---------------------------------------------------------------- dtype-changing views
@lower("view_as_real", raw=True, cpu_view=True)
def view_as_real(self):
    # CPU's kernel checks (complex, not conj) and aliases self's storage with the real dtype
    return _aten.view_as_real.default.redispatch(_CPU, self)


@lower("view_as_complex", raw=True, cpu_view=True)
def view_as_complex(self):
    # CPU's kernel checks (last dim 2 with stride 1, even strides/offset) and aliases the storage
    return _aten.view_as_complex.default.redispatch(_CPU, self)


# ---------------------------------------------------------------- construction and parts


def _check_parts(a, b) -> None:
    """ATen's complex_check_dtype (torch's meta kernel lets these through)."""
    da, db = dtypes.to_torch(a.dtype), dtypes.to_torch(b.dtype)
    floats = (torch.float16, torch.float32, torch.float64)
    if da not in floats or db not in floats:
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got "
                           f"{dtypes.scalar_name(da)} and {dtypes.scalar_name(db)}")
    if da != db:
        raise RuntimeError(f"Expected object of scalar type {dtypes.scalar_name(da)} but got scalar type {dtypes.scalar_name(db)} "
                           "for second argument")


def _make_complex(re, im, spec):
    """lax.complex, not re + 1j * im: 1j * inf would be nan + inf j."""
    part = dtypes.to_jax(spec.dtype.to_real())
    re, im = jnp.broadcast_arrays(jnp.asarray(re, part), jnp.asarray(im, part))
    return lax.complex(re, im)


@lower("complex", needs_spec=True)
def complex_(real, imag, *, spec):
    _check_parts(real, imag)
    return _make_complex(real, imag, spec)


@lower("polar", needs_spec=True)
def polar(abs, angle, *, spec):
    # abs * cos(angle) + i abs * sin(angle), as ATen computes it
    _check_parts(abs, angle)
    return _make_complex(abs * jnp.cos(angle), abs * jnp.sin(angle), spec)


@lower("angle", needs_spec=True)
def angle(self, *, spec):
    if jnp.iscomplexobj(self):
        return jnp.arctan2(jnp.imag(self), jnp.real(self))
    out = dtypes.to_jax(spec.dtype)
    x = self.astype(out)
    # ATen: pi for negatives, 0 otherwise, NaN stays NaN
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(np.pi, out), jnp.zeros((), out)))


# ---------------------------------------------------------------- conj_physical
@lower("_conj_physical")
def conj_physical(self):
    return jnp.conj(self)


@lower("conj_physical.out", raw=True)
def conj_physical_out(self, *, out):
    # the leaf CPU kernel (conj_physical() and conj_physical_() are composites over it)
    if not torch.can_cast(self.dtype, out.dtype):
        raise cpu_error(torch.ops.aten.conj_physical.out, (self,), {"out": out}) or RuntimeError(
            f"result type {self.dtype} can't be cast to the desired output type {out.dtype}")
    value = storage.read(self)
    value = jnp.conj(value) if jnp.iscomplexobj(value) else value
    if tuple(out.shape) != tuple(self.shape):
        storage.replace_storage(out, None, self.shape)  # resize_output, as for every out= variant
    else:
        storage.check_no_partial_overlap(out, self)
    storage.write(out, value)
    return out




@lower("conj_physical_", raw=True)
def conj_physical_inplace(self):
    # CompositeExplicitAutograd in ATen, but it calls a CPU/CUDA DispatchStub directly
    if self.is_complex():
        storage.write(self, jnp.conj(storage.read(self)))
    return self
