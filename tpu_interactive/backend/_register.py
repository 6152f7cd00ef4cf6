"""Register the `tpu` device with torch: rename PrivateUse1, device module, kernels, fallback."""
from __future__ import annotations

import torch

_done = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register() -> None:
    global _done
    if _done:
        return
    from .coexist import check_coexistence
    from .versions import warn_if_untested

    check_coexistence()  # another PrivateUse1/'tpu' backend in this process: one clear error, no mixing
    warn_if_untested()
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from . import device_module, native

    if torch._C._get_privateuse1_backend_name() != "tpu":
        # C++ hooks first (torch keeps the first ones registered); the Python ones stay as fallback
        native.install()
        _setup_privateuseone_for_python_backend("tpu", backend_module=device_module, hook=_Hooks(),
                                                device_guard=_Guard())
    from . import installation  # needs the 'tpu' device name to exist

    if native.available():  # the warm eager path in C++ (fast_path.py), before the kernels are made
        from . import fast_path

        fast_path.install(native.module())
        from . import errors

        errors.NATIVE_USER_SITE[0] = native.module().user_site
    installation.install()
    from . import autocast  # torch.autocast("tpu"): CUDA's op policy at AutocastPrivateUse1
    autocast.register()
    _allocate_storages_in_python()
    _backward_on_this_thread()
    _import_what_the_first_op_would()
    _done = True


def _import_what_the_first_op_would() -> None:
    """Torch's meta kernels (``@torch._disable_dynamo``) import torch._dynamo, ~800 modules and most of a
    second, on their first call. Ctrl-C landing inside that import leaves torch's modules half made and
    every later op failing ("partially initialized module 'torch._dynamo'") until a restart: paid here,
    an interrupted first cell stays harmless."""
    import torch._dynamo  # noqa: F401


def _backward_on_this_thread() -> None:
    """Backward passes of the importing thread (a notebook's, a script's) run on it, not on torch's
    worker thread for the device (torch's thread-local ``set_multithreading_enabled``): with one
    device that thread only adds a hand-off between threads around every node that needs the other
    (0.4-0.9 ms of a transformer block's 3-4 ms backward here). Errors in backward then carry the
    caller's stack, and Ctrl-C interrupts a long backward. ``TPU_INTERACTIVE_BACKWARD_THREAD=device``
    keeps torch's worker thread."""
    import os

    if os.environ.get("TPU_INTERACTIVE_BACKWARD_THREAD", "caller") != "device":
        torch.autograd.set_multithreading_enabled(False)


def _allocate_storages_in_python() -> None:
    """``torch.UntypedStorage(nbytes, device="tpu")`` would call the PrivateUse1 allocator, which a
    pure-Python backend cannot register (torch crashes on the null allocator). Torch itself allocates
    that way in ``copy.deepcopy`` of a tpu tensor and in ``torch.load`` onto tpu; route those to our
    storages (the copy_ that follows runs through our copy_ kernel)."""
    from . import storage

    untyped = torch.UntypedStorage
    if getattr(untyped.__new__, "_tpu_interactive", False):
        return
    original = untyped.__new__

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if (device is not None and torch.device(device).type == "tpu" and len(args) == 1
                and isinstance(args[0], int) and set(kwargs) == {"device"}):
            return storage.empty_storage(args[0])
        return original(cls, *args, **kwargs)

    __new__._tpu_interactive = True
    untyped.__new__ = staticmethod(__new__)

    # pickle (torch's legacy storage format) copies device bytes in C++ through a storage object
    # that has lost our buffer: go through a host storage instead
    write_file, set_from_file = untyped._write_file, untyped._set_from_file

    def _write_file(self, *args, **kwargs):
        return write_file(self.cpu() if self.device.type == "tpu" else self, *args, **kwargs)

    def _set_from_file(self, *args, **kwargs):
        if self.device.type != "tpu":
            return set_from_file(self, *args, **kwargs)
        host = torch.UntypedStorage(self.nbytes())
        set_from_file(host, *args, **kwargs)
        self.copy_(host)
        return self

    untyped._write_file, untyped._set_from_file = _write_file, _set_from_file
