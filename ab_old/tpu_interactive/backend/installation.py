"""Installs the registry as PrivateUse1 kernels: each lowering, its derived in-place and ``out=``
variants, and the fallback for every other op (``_register.register()`` calls :func:`install` once)."""
from __future__ import annotations

from typing import Callable

import torch

from . import foreach, native
from .dispatch import derived_variants, make_functional, make_inplace, make_out
from .fallback import fallback
from .registry import LOWERINGS, op_key

def _impl_name(key: str) -> str:
    return key[: -len(".default")] if key.endswith(".default") else key


_libraries: list = []


def _impl(lib: torch.library.Library, name: str, kernel: Callable) -> None:
    """Register ``kernel`` as ``aten::name``'s PrivateUse1 kernel: a fast path kernel (fast_path.front)
    through the C++ extension's front end on torch's IValues (csrc/boxed_front.cpp: a call its plan
    serves makes no Python objects), any other through torch.library."""
    if native.available() and native.module().fast_is_kernel(kernel):
        native.module().fast_register(name, kernel)
    else:
        lib.impl(name, kernel, "PrivateUse1")


def _fake_safe(op: torch._ops.OpOverload, kernel: Callable) -> Callable:
    """FakeTensor (torch.compile tracing) runs a CompositeImplicitAutograd op's *device* kernel with
    fake tensors (their C++ "meta" is the composite): decompose there, as torch itself would."""
    try:
        composite = op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # a few python-only overloads (index.Tensor_hacked_twin) are unknown to C++
        composite = False
    if not composite:
        return kernel

    def kernel_or_decompose(*args, **kwargs):
        if torch._C._meta_in_tls_dispatch_include():
            return op.decompose(*args, **kwargs)
        return kernel(*args, **kwargs)

    return kernel_or_decompose


def install() -> None:
    if _libraries:
        return
    from . import ops  # noqa: F401  (importing the ops modules fills the registry)

    try:
        from . import kernels  # noqa: F401  (attaches the Pallas variants to their lowerings)
    except ImportError as exc:  # the Pallas paths are optional; the XLA lowerings always work
        if "pallas" not in str(exc):
            raise

    ops.attention.route(native.module())  # F.scaled_dot_product_attention: the C++ choice, else ours
    lib = torch.library.Library("aten", "IMPL")
    registered = set()
    cpu_views = [key for key, low in LOWERINGS.items() if low.cpu_view] if native.available() else []
    if cpu_views:  # CPU's own view kernels, reached from C++ (no Python per view)
        native.module().register_cpu_views([_impl_name(key) for key in cpu_views])
        registered.update(cpu_views)
    for key, low in LOWERINGS.items():
        if key not in registered:
            _impl(lib, _impl_name(key), _fake_safe(low.overload, make_functional(low)))
            registered.add(key)
    for key, low in list(LOWERINGS.items()):
        if low.raw:
            continue
        for kind, variant in derived_variants(key):
            vkey = op_key(variant)
            if vkey in registered:
                continue
            kernel = make_inplace(low, variant) if kind == "inplace" else make_out(low, variant)
            _impl(lib, _impl_name(vkey), kernel)
            registered.add(vkey)
    for op in foreach.overloads():  # one program per call (foreach.py), not one per tensor
        key = op_key(op)
        if key not in registered:
            _impl(lib, _impl_name(key), foreach.make_kernel(op))
            registered.add(key)
    _check_no_composite_overrides(registered)
    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(fallback, "PrivateUse1")
    _libraries.extend([lib, fallback_lib])


# A tpu kernel for a CompositeImplicitAutograd op silently removes its autograd (the Autograd key
# then falls through to our kernel). These few are deliberate: no gradient needed, or an autograd
# kernel of our own is registered next to them.
_COMPOSITE_OVERRIDES_OK = {
    "_has_compatible_shallow_copy_type.default": "metadata query, not differentiable",
    "_scaled_dot_product_attention_math.default": "ops/attention.py registers its AutogradPrivateUse1 kernel",
    "silu_backward.default": "only reached from silu's derivative; first-order gradients stay exact",
    "mish_backward.default": "only reached from mish's derivative; first-order gradients stay exact",
}


def _check_no_composite_overrides(registered) -> None:
    bad = [k for k in registered if k not in _COMPOSITE_OVERRIDES_OK and
           torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_impl_name(k)}", "CompositeImplicitAutograd")]
    if bad:
        raise RuntimeError(f"tpu lowerings registered for CompositeImplicitAutograd ops would drop their "
                           f"gradients: {sorted(bad)}")
