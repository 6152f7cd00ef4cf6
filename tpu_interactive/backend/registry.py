"""The one table of lowerings: aten overload name -> JAX implementation plus how to call it.

Read it as a table with ``tpu_interactive.backend.registry.table()``. Lowerings are plain functions
in ``backend/ops/*.py`` registered with ``@lower("aten_name.overload", ...)``:

- default: the function receives ``jax.Array``s where the op takes tensors (python scalars stay
  python scalars) and returns arrays; output shapes/dtypes come from torch's meta kernels, so dtype
  promotion, broadcasting and error messages match CPU PyTorch.
- ``promote=Promote.RESULT``: tensor/scalar inputs are first cast to the op's result dtype
  (arithmetic); ``Promote.COMMON``: to ``torch.result_type`` of the inputs (comparisons).
- ``meta=False``: for data-dependent output shapes (nonzero, masked_select, ...): the result's
  own shape is used, dtype from ``out_dtype`` if given.
- ``raw=True``: the function receives the torch arguments themselves and returns torch values
  (factories, copies, views, RNG): it owns its semantics.
- ``torch_versions="<2.14"``: the torch releases the lowering applies to (a PEP 440 specifier
  set); on other releases it is skipped. An op the installed torch does not have is skipped too, so
  a newer torch never breaks the import; both are listed by ``skipped()`` (and ``%tpu ops``).

In-place (``add_``) and ``out=`` variants of every functional lowering are derived, not written.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version


class Promote(str, enum.Enum):
    """How dispatch casts a lowering's tensor and scalar inputs before calling it."""

    RESULT = "result"  # to the op's result dtype (arithmetic; TensorIterator's compute dtype)
    COMMON = "common"  # to torch.result_type of the inputs (comparisons, whose result is bool)


@dataclasses.dataclass
class Lowering:
    """One registry entry: how dispatch (and the compiler) run the aten overload ``name``."""

    name: str  # "op.overload", the key in LOWERINGS
    fn: Callable  # the lowering: jax arrays in, arrays out (torch values when raw)
    promote: Promote | None = None  # input casting before fn (None: inputs as they are)
    # False: the output shape is data-dependent (nonzero, ...): no meta kernel call, the result's own
    # shape is used and its dtype is out_dtype(array) when given
    meta: bool = True
    raw: bool = False  # fn takes and returns torch values (views, factories, copies, RNG); no derived variants
    allow_cpu_tensors: bool = False  # CPU tensor arguments of any dim are read as values (not a device error)
    out_dtype: Callable | None = None  # with meta=False: the torch dtype of the result, from the array
    module: str = ""  # the ops module that registered it (registry.table(), `%tpu ops`)
    # Inputs must share one dtype (CPU's BLAS-backed kernels refuse mixes that meta kernels accept):
    # a mix is reported with CPU's own error instead of being silently promoted.
    strict_dtypes: bool = False
    # Alternative implementation used when tpu_interactive.pallas(True) (same signature as fn).
    pallas_fn: Callable | None = None

    @property
    def overload(self) -> torch._ops.OpOverload:
        return resolve(self.name)


LOWERINGS: dict[str, Lowering] = {}
# aten overload name -> why its lowering is not registered with the installed torch
SKIPPED: dict[str, str] = {}
# the installed release without local labels ("2.14.1+cu130" -> 2.14.1), so specifiers compare cleanly
TORCH_VERSION = Version(Version(torch.__version__.split("+")[0]).base_version)


def resolve(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _skip_reason(key: str, torch_versions: str | None) -> str | None:
    if torch_versions is not None and TORCH_VERSION not in SpecifierSet(torch_versions):
        return f"lowering applies to torch{torch_versions}; installed torch is {TORCH_VERSION}"
    try:
        resolve(key)
    except AttributeError:
        return f"aten::{key} does not exist in the installed torch {TORCH_VERSION}"
    return None


def canonical(name: str) -> str:
    return name if "." in name else name + ".default"


def lower(*names: str, torch_versions: str | None = None, **options) -> Callable[[Callable], Callable]:
    """Register the decorated function as the lowering of the aten overloads ``names`` ("op" means
    "op.default"); ``options`` are :class:`Lowering`'s fields (``promote``, ``meta``, ``raw``, ...).

    ``torch_versions`` (a PEP 440 specifier set) limits it to those torch releases; a lowering for
    another release, or for an op the installed torch lacks, is recorded in ``skipped()`` instead.
    One function may lower several overloads that share its signature."""
    if options.get("promote") is not None:
        options["promote"] = Promote(options["promote"])

    def register(fn: Callable) -> Callable:
        for name in names:
            key = canonical(name)
            if key in LOWERINGS or key in SKIPPED:
                raise ValueError(f"duplicate lowering for aten::{key}")
            reason = _skip_reason(key, torch_versions)
            if reason is not None:
                # tests/test_versions.py fails on a tested torch for a skip no lowering declared (a typo)
                SKIPPED[key] = reason
                continue
            LOWERINGS[key] = Lowering(key, fn, module=fn.__module__.rsplit(".", 1)[-1], **options)
        return fn

    return register


def pallas_variant(*names: str) -> Callable[[Callable], Callable]:
    """Register a Pallas implementation for already-lowered ops (taken when the Pallas switch is on)."""
    def register(fn: Callable) -> Callable:
        for name in names:
            if canonical(name) not in SKIPPED:
                LOWERINGS[canonical(name)].pallas_fn = fn
        return fn

    return register


def skipped() -> dict[str, str]:
    """Lowerings not registered with the installed torch: ``{"aten::op.overload": reason}``."""
    return {f"aten::{key}": SKIPPED[key] for key in sorted(SKIPPED)}


def table() -> list[dict]:
    """The registry as rows: op, module, function, options (for docs and `%tpu ops`)."""
    rows = []
    for key in sorted(LOWERINGS):
        low = LOWERINGS[key]
        rows.append({
            "op": f"aten::{key}", "module": low.module, "function": low.fn.__name__,
            "promote": low.promote.value if low.promote else "", "meta": low.meta, "raw": low.raw,
            "pallas": low.pallas_fn is not None,
        })
    return rows
