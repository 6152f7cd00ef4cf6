"""FFTs: ATen's three primitives (_fft_r2c, _fft_c2c, _fft_c2r) via jnp.fft.

Every torch.fft.* function, stft/istft and the FFT derivatives reduce to these three. ATen's
``normalization`` is an enum (0 = none, 1 = 1/sqrt(n), 2 = 1/n, n = the product of the transformed
signal sizes) that scales forward and backward transforms alike; jnp's ``norm`` names say which
direction is scaled, so the mapping depends on the direction. _fft_r2c is always a forward
transform and _fft_c2r a backward one (torch conjugates around them for the other direction).
"""
from __future__ import annotations

import jax.numpy as jnp

from ..registry import lower


def _norm(normalization: int, forward: bool) -> str:
    if normalization == 1:
        return "ortho"
    if normalization not in (0, 2):
        raise RuntimeError(f"_fft: invalid normalization mode {normalization} (expected 0, 1 or 2)")
    unscaled = normalization == 0
    return "backward" if unscaled == forward else "forward"


def _check_dims(op: str, x, dim) -> None:
    for d in dim:
        if x.shape[d] == 0:
            raise RuntimeError(f"{op}: invalid number of data points (0) specified along dim {d}")


@lower("_fft_r2c")
def fft_r2c(self, dim, normalization, onesided):
    _check_dims("_fft_r2c", self, dim)
    norm = _norm(normalization, True)
    if onesided:  # the last dim of ``dim`` keeps n // 2 + 1 bins, like numpy's rfftn
        return jnp.fft.rfftn(self, axes=dim, norm=norm)
    return jnp.fft.fftn(self, axes=dim, norm=norm)


@lower("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    _check_dims("_fft_c2c", self, dim)
    transform = jnp.fft.fftn if forward else jnp.fft.ifftn
    return transform(self, axes=dim, norm=_norm(normalization, forward))


@lower("_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    _check_dims("_fft_c2r", self, dim)
    if last_dim_size <= 0:
        raise RuntimeError(f"_fft_c2r: invalid number of data points ({last_dim_size}) specified")
    # only the last transformed dim changes size; the others keep the input's sizes
    sizes = [self.shape[d] for d in dim[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(self, s=sizes, axes=dim, norm=_norm(normalization, False))
