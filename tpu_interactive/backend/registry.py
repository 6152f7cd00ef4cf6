"""The one table of lowerings: aten overload name -> JAX implementation plus how to call it.

Read it as a table with ``tpu_interactive.backend.registry.table()``. Lowerings are plain functions
in ``backend/ops/*.py`` registered with ``@lower("aten_name.overload", ...)``:

- default: the function receives ``jax.Array``s where the op takes tensors (python scalars stay
  python scalars) and returns arrays; output shapes/dtypes come from torch's meta kernels, so dtype
  promotion, broadcasting and error messages match CPU PyTorch.
- ``promote="result"``: tensor/scalar inputs are first cast to the op's result dtype (arithmetic);
  ``promote="common"``: to ``torch.result_type`` of the inputs (comparisons).
- ``meta=False``: for data-dependent output shapes (nonzero, masked_select, ...): the result's
  own shape is used, dtype from ``out_dtype`` if given.
- ``raw=True``: the function receives the torch arguments themselves and returns torch values
  (factories, copies, views, RNG): it owns its semantics.

In-place (``add_``) and ``out=`` variants of every functional lowering are derived, not written.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch


@dataclasses.dataclass
class Lowering:
    name: str
    fn: Callable
    promote: str | None = None
    meta: bool = True
    raw: bool = False
    allow_cpu_tensors: bool = False
    out_dtype: Callable | None = None
    module: str = ""
    # Inputs must share one dtype (CPU's BLAS-backed kernels refuse mixes that meta kernels accept):
    # a mix is reported with CPU's own error instead of being silently promoted.
    strict_dtypes: bool = False
    # Alternative implementation used when tpu_interactive.pallas(True) (same signature as fn).
    pallas_fn: Callable | None = None

    @property
    def overload(self) -> torch._ops.OpOverload:
        return resolve(self.name)


LOWERINGS: dict[str, Lowering] = {}


def resolve(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def canonical(name: str) -> str:
    return name if "." in name else name + ".default"


def lower(*names: str, **options) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            key = canonical(name)
            if key in LOWERINGS:
                raise ValueError(f"duplicate lowering for aten::{key}")
            resolve(key)  # fail at import for a misspelt op
            LOWERINGS[key] = Lowering(key, fn, module=fn.__module__.rsplit(".", 1)[-1], **options)
        return fn

    return register


def pallas_variant(*names: str) -> Callable[[Callable], Callable]:
    """Register a Pallas implementation for already-lowered ops (taken when the Pallas switch is on)."""
    def register(fn: Callable) -> Callable:
        for name in names:
            LOWERINGS[canonical(name)].pallas_fn = fn
        return fn

    return register


def table() -> list[dict]:
    """The registry as rows: op, module, function, options (for docs and `%tpu ops`)."""
    rows = []
    for key in sorted(LOWERINGS):
        low = LOWERINGS[key]
        rows.append({
            "op": f"aten::{key}", "module": low.module, "function": low.fn.__name__,
            "promote": low.promote or "", "meta": low.meta, "raw": low.raw, "pallas": low.pallas_fn is not None,
        })
    return rows
