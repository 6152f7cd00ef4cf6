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
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from . import device_module

    if torch._C._get_privateuse1_backend_name() != "tpu":
        _setup_privateuseone_for_python_backend("tpu", backend_module=device_module, hook=_Hooks(),
                                                device_guard=_Guard())
    from . import dispatch  # needs the 'tpu' device name to exist

    dispatch.install()
    _done = True
