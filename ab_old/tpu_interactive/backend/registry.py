"""The one table of lowerings: aten overload name -> JAX implementation plus how to call it.

Read it as a table with ``tpu_interactive.backend.registry.table()``. Lowerings are plain functions
in ``backend/ops/*.py`` registered with ``@lower("aten_name.overload", ...)``:

- default: the function receives ``jax.Array``s where the op takes tensors (python scalars stay
  python scalars) and returns arrays; output shapes/dtypes come from torch's meta kernels, so dtype
  promotion, broadcasting and error messages match CPU PyTorch.
- ``promote=Promote.RESULT``: tensor/scalar inputs are first cast to the op's result dtype
  (arithmetic); ``Promote.COMMON``: to ``torch.result_type`` of the inputs (comparisons).
- ``dtypes=FLOATING`` (a :class:`DtypeKind`): the result dtypes CPU's kernel exists for; dispatch
  refuses others before the lowering runs, with CPU's ``NotImplementedError('"kernel" not
  implemented for 'Bool'')`` (``cpu_kernel`` names the kernel where it is not the op's name).
- ``needs_spec=True``: the lowering reads torch's output metadata (result dtype, output shapes): it
  is called with the op's ``dispatch.OpSpec`` as the keyword argument ``spec``, eagerly and in
  compiled graphs alike.
- ``meta=False``: for data-dependent output shapes (nonzero, masked_select, ...): the result's
  own shape is used, dtype from ``out_dtype`` if given.
- ``raw=True``: the function receives the torch arguments themselves and returns torch values
  (factories, copies, views, RNG): it owns its semantics.
- ``torch_versions="<2.14"``: the torch releases the lowering applies to (a PEP 440 specifier
  set); on other releases it is skipped. An op the installed torch does not have is skipped too, so
  a newer torch never breaks the import; both are listed by ``skipped()`` (and ``%tpu ops``).

In-place (``add_``) and ``out=`` variants of every functional lowering are derived, not written.
A Pallas kernel is attached to a lowering with ``@pallas_variant("op", ...)`` (backend/kernels/).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import dtypes as _dtypes
from .stats import record_kernel_path


class Promote(str, enum.Enum):
    """How dispatch casts a lowering's tensor and scalar inputs before calling it."""

    RESULT = "result"  # to the op's result dtype (arithmetic; TensorIterator's compute dtype)
    COMMON = "common"  # to torch.result_type of the inputs (comparisons, whose result is bool)


@dataclasses.dataclass(frozen=True)
class DtypeKind:
    """A set of dtypes a CPU kernel is dispatched for (its ``AT_DISPATCH_*`` list)."""

    name: str  # shown by registry.table() and `%tpu ops --lowerings`
    accepts: Callable[[torch.dtype], bool]

    def __repr__(self) -> str:
        return self.name

    def __stable__(self) -> str:  # program_store's key text
        return self.name


def _integral(d: torch.dtype) -> bool:
    return not d.is_floating_point and not d.is_complex


# The kinds lowerings declare with ``@lower(..., dtypes=...)`` (as jax's ``standard_unop(_float, ...)``).
FLOATING = DtypeKind("floating", lambda d: d.is_floating_point)
FLOAT_AND_DOUBLE = DtypeKind("float32/float64", lambda d: d.is_floating_point and d.itemsize >= 4)
FLOATING_AND_COMPLEX = DtypeKind("floating/complex", lambda d: d.is_floating_point or d.is_complex)
ALL_BUT_BOOL = DtypeKind("all but bool", lambda d: d != torch.bool)
INTEGRAL = DtypeKind("integral/bool", _integral)
INTEGRAL_NO_BOOL = DtypeKind("integral", lambda d: _integral(d) and d != torch.bool)
UNCHANGED = object()  # a ``fresh_value`` result: self's never-written buffer already holds the result


@dataclasses.dataclass
class Lowering:
    """One registry entry: how dispatch (and the compiler) run the aten overload ``name``.

    Every field but ``name``, ``fn``, ``module`` and ``pallas_fn`` is an option of :func:`lower`."""

    name: str
    """"op.overload", the key in ``LOWERINGS``."""
    fn: Callable
    """The lowering: jax arrays in, arrays out (torch values in and out when ``raw``)."""
    promote: Promote | None = None
    """How inputs are cast before ``fn`` runs (None: as they are); see :class:`Promote`."""
    dtypes: DtypeKind | None = None
    """The result dtypes CPU's kernel exists for (None: any): dispatch and the compiler refuse others
    before ``fn`` runs, raising CPU's ``NotImplementedError`` (meta kernels accept them)."""
    cpu_kernel: str = ""
    """The kernel name CPU's refusal of a ``dtypes`` mismatch quotes ('"elu" not implemented for
    'Long''); empty: the aten op's name."""
    needs_spec: bool = False
    """``fn`` reads torch's output metadata: it is called with the op's ``dispatch.OpSpec`` (result
    dtype, output shapes; None when ``meta`` is False) as the keyword argument ``spec``."""
    meta: bool = True
    """False: the output shape is data-dependent (nonzero, ...): no meta kernel runs; the result's own
    shape is used and its dtype is ``out_dtype(array)`` when given."""
    raw: bool = False
    """``fn`` takes and returns torch values (views, factories, copies, RNG); no derived variants."""
    cpu_view: bool = False
    """A ``raw`` view whose kernel is CPU's (it only aliases the storage with new geometry): where the
    C++ extension is built, that kernel is registered from C++ and ``fn`` is not called."""
    allow_cpu_tensors: bool = False
    """CPU tensor arguments of any dim are read as values (not "Expected all tensors on the same device")."""
    out_dtype: Callable | None = None
    """With ``meta=False``: the torch dtype of the result, from the array."""
    module: str = ""
    """The ops module that registered it (``table()``, ``%tpu ops --lowerings``); set by :func:`lower`."""
    strict_dtypes: bool = False
    """Inputs must share one dtype (CPU's BLAS-backed kernels refuse mixes that meta kernels
    accept): a mix is reported with CPU's own error instead of being silently promoted."""
    scalar_values_in_meta: bool | None = None
    """Whether a Python float's *value* can change torch's output metadata (the meta-spec cache keys
    it by value then). Default: no when ``promote`` is set, yes otherwise; False declares an op
    whose floats only scale values (``addcdiv``'s ``value``), so a new float each step (AdamW's step
    size) is a cache hit, not a meta-kernel call."""
    host_check: Callable | None = None
    """``host_check(args, kwargs)`` with the torch arguments, before the lowering runs: raises torch's
    error for argument *values* that cannot be checked inside a program (a Scalar that overflows the
    tensor's dtype). The fast path keys floats by value for such ops, so every value is checked once."""
    fresh_value: Callable | None = None
    """For the in-place form, whose self is often a new ``empty`` (``torch.ones``, ``ones_like``, the
    ``ones_like(loss)`` of every ``backward()``): ``fresh_value(self, *args)`` with the torch arguments,
    once the checks passed, where self is its whole never-written buffer: the buffer's new array, made
    without reading or recording self; :data:`UNCHANGED` where that buffer already reads as the result
    (``zero_``: a never-written buffer reads as zeros); None: the usual path."""
    composite_when: Callable[..., bool] | None = None
    """``composite_when(*args, **kwargs)`` with the torch arguments: the calls the lowering does not
    cover (``clone`` keeping a permuted tensor's strides, a copy to another device), which run torch's
    own CompositeExplicitAutograd kernel instead. They offer no fast-path plan, so they keep coming here."""
    pallas_fn: Callable | None = None
    """The Pallas implementation taken when ``config.pallas`` is on (same signature as ``fn``); set
    by :func:`pallas_variant`."""
    pallas_covers: Callable[..., bool] | None = None
    """``pallas_covers(*args, **kwargs)``: whether ``pallas_fn`` covers a call (same arguments, arrays or
    anything with their shape/dtype/ndim/size); decided before the call, so it is counted right."""

    def __stable__(self) -> str:  # program_store's key text: one lowering per overload
        return self.name

    @property
    def meta_by_type(self) -> bool:
        """Key Python floats by type, not value, in the meta-spec cache."""
        if self.scalar_values_in_meta is not None:
            return not self.scalar_values_in_meta
        return self.promote is not None and self.host_check is None

    @property
    def overload(self) -> torch._ops.OpOverload:
        return resolve(self.name)

    def check_dtype(self, dtype: torch.dtype | None) -> None:
        """Raise CPU's error when the result dtype ``dtype`` is outside ``dtypes`` (None: unknown)."""
        if self.dtypes is not None:
            require_dtype(self.dtypes, self.cpu_kernel or self.name.split(".")[0], dtype)


def require_dtype(kind: DtypeKind, kernel: str, dtype: torch.dtype | None) -> None:
    """Raise as CPU PyTorch does when its kernel ``kernel`` has no implementation for ``dtype``
    (None: unknown, nothing to check). Lowerings declare the rule with ``@lower(dtypes=...)``; they
    call this only where the rule depends on argument values (the kernel name, ...)."""
    if dtype is not None and not kind.accepts(dtype):
        raise NotImplementedError(f'"{kernel}" not implemented for \'{_dtypes.scalar_name(dtype)}\'')


LOWERINGS: dict[str, Lowering] = {}
# aten overload name -> why its lowering is not registered with the installed torch
SKIPPED: dict[str, str] = {}
# the installed release without local labels ("2.14.1+cu130" -> 2.14.1), so specifiers compare cleanly
TORCH_VERSION = Version(Version(torch.__version__.split("+")[0]).base_version)


def op_key(op) -> str:
    """'add.Tensor' for aten ops (the registry's key), 'mylib::foo.default' for other namespaces."""
    namespace, name = op._schema.name.split("::")
    return f"{name}.{op._overloadname}" if namespace == "aten" else f"{namespace}::{name}.{op._overloadname}"


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
    "op.default"); one function may lower several overloads that share its signature.

    ``options`` are :class:`Lowering`'s fields, each documented there: ``promote`` (input casting),
    ``dtypes``/``cpu_kernel`` (the result dtypes CPU's kernel exists for, checked by dispatch),
    ``needs_spec`` (pass torch's output metadata as ``spec=``), ``meta``/``out_dtype``
    (data-dependent shapes), ``raw`` (torch values in and out), ``cpu_view`` (a raw view whose
    kernel is CPU's), ``allow_cpu_tensors``, ``strict_dtypes``, ``composite_when`` (calls left to
    torch's composite kernel). ``torch_versions`` (a PEP 440 specifier set) limits it to those torch
    releases; a lowering for another release, or for an op the installed torch lacks, is recorded in
    ``skipped()`` instead. Example::

        @lower("hypot", promote=Promote.RESULT, dtypes=FLOATING)
        def hypot(x, y):
            return jnp.hypot(opmath(x), opmath(y))
    """
    if options.get("promote") is not None:
        options["promote"] = Promote(options["promote"])
    if options.get("host_check") is not None and options.get("scalar_values_in_meta") is False:
        raise ValueError("a host_check sees every float value only if floats are keyed by value")
    if options.get("cpu_view") and not options.get("raw"):
        raise ValueError("cpu_view declares a raw view lowering (torch values in and out)")

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


def pallas_variant(*names: str, covers: Callable[..., bool]) -> Callable[[Callable], Callable]:
    """Attach the decorated function as the Pallas implementation of the lowered ops ``names``
    (taken when the Pallas switch is on; same arguments as the lowering) for the calls ``covers``
    accepts (same arguments; it reads their dtypes and shapes). Other calls take the op's own
    lowering and are counted as 'xla'. The choice is made where the call is dispatched, not inside
    the traced program, so it holds for a program loaded from disk or run again from memory. A name
    whose lowering was skipped for this torch is skipped too; a raw lowering cannot have a variant."""
    def register(variant: Callable) -> Callable:
        for name in names:
            key = canonical(name)
            if key in SKIPPED:
                continue
            low = LOWERINGS.get(key)
            if low is None:
                raise ValueError(f"no lowering of aten::{key} to attach a Pallas variant to")
            if low.raw:
                raise ValueError(f"aten::{key} is lowered raw (torch values): it cannot take a Pallas variant")
            low.pallas_fn, low.pallas_covers = variant, covers
        return variant

    return register


def pallas_path(low: Lowering, pallas_on: bool, args, kwargs) -> tuple[Callable, str]:
    """(the function a call of ``low`` with a Pallas variant runs, 'pallas' or 'xla'), counted in stats."""
    use = pallas_on and bool(low.pallas_covers(*args, **kwargs))
    path = "pallas" if use else "xla"
    record_kernel_path(f"aten::{low.name}", path)
    return (low.pallas_fn if use else low.fn), path


def skipped() -> dict[str, str]:
    """Lowerings not registered with the installed torch: ``{"aten::op.overload": reason}``."""
    return {f"aten::{key}": SKIPPED[key] for key in sorted(SKIPPED)}


def table() -> list[dict]:
    """The registry as rows, one per lowered overload, sorted by op: op, module, function, promote,
    dtypes (a :class:`DtypeKind`'s name, "" for any), needs_spec, meta, raw, pallas (for docs and
    ``%tpu ops --lowerings``)."""
    rows = []
    for key in sorted(LOWERINGS):
        low = LOWERINGS[key]
        rows.append({
            "op": f"aten::{key}", "module": low.module, "function": low.fn.__name__,
            "promote": low.promote.value if low.promote else "",
            "dtypes": low.dtypes.name if low.dtypes else "", "needs_spec": low.needs_spec,
            "meta": low.meta, "raw": low.raw, "pallas": low.pallas_fn is not None,
        })
    return rows
