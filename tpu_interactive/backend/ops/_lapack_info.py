"""LAPACK's info for the linalg lowerings, and torch's own check of it (``check_errors=True``, or an op that always
checks): its error type and words, in eager from the info's values, or traced into a fused segment or a
compiled graph with words made by the same check on a stand-in info."""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import torch

from .. import graph_checks


def first_true(flags):
    """1-based index of the first True along the last axis, 0 if none (LAPACK info)."""
    if flags.shape[-1] == 0:
        return jnp.zeros(flags.shape[:-1], jnp.int32)
    first = jnp.argmax(flags, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(flags, axis=-1), first, 0).astype(jnp.int32)


def check_lapack_info(info, api: str, batched: bool, negative: bool = False) -> None:
    """torch's own check of LAPACK's info (``check_errors=True``, or an op that always checks), in its
    words, batch element included: one host read in eager; traced into a fused segment or a compiled graph
    (``negative``: the info a failure has there is negative, an illegal argument)."""
    if graph_checks.is_traced(info):  # (a per-op program: NeedsEager, it runs eagerly instead)
        flat = info.reshape(-1)
        position = jnp.argmax(flat != 0)
        stand_in = _stand_in_error(api, batched, negative)
        graph_checks.check_in_graph(jnp.any(flat != 0), flat[position], type(stand_in),
                                    functools.partial(_lapack_words, str(stand_in)), position)
        return
    torch._linalg_check_errors(torch.from_numpy(np.array(info)), api, is_matrix=not batched)


_SENTINEL = 7654321  # an info value torch's words print as it is, replaced by the failing call's


def _stand_in_error(api: str, batched: bool, negative: bool) -> RuntimeError:
    """The error torch's check raises for a stand-in info (batch element 1 failing): its type and words."""
    stand_in = torch.zeros(2 if batched else (), dtype=torch.int32)
    stand_in[(1,) if batched else ()] = -4 if negative else _SENTINEL  # svd's NaN: words without a value
    try:
        torch._linalg_check_errors(stand_in, api, is_matrix=not batched)
    except RuntimeError as exc:
        return exc
    raise AssertionError(f"torch's check of {api} accepted a failing info")


def _lapack_words(stand_in: str, value, position) -> str:
    return stand_in.replace(str(_SENTINEL), str(value)).replace("(Batch element 1)", f"(Batch element {position})")
