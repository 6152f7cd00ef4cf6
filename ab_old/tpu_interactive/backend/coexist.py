"""One PrivateUse1 backend per process: refuse, with one clear error, to register over another one.

torch has a single PrivateUse1 slot. Another library may already hold it: renamed (torchax calls it
``jax``), with a device module (``torch.<name>``), with kernels, or loaded by torch itself at
``import torch`` through the ``torch.backends`` entry point (device-backend autoload). Registering our
kernels next to theirs would mix two backends' kernels in one process, so we stop and say who owns
it and what to do instead.
"""
from __future__ import annotations

import os
import sys
import types
from importlib import metadata

import torch

_OURS = f"{__package__}.device_module"
_FREE = "privateuseone"  # torch's name for an unclaimed PrivateUse1


class BackendConflictError(RuntimeError):
    """Another library already owns torch's PrivateUse1 backend (or a 'tpu' device) in this process."""


def check_coexistence() -> None:
    """Raise BackendConflictError unless PrivateUse1 is unclaimed or already ours (re-import, reload)."""
    name = torch._C._get_privateuse1_backend_name()
    module = getattr(torch, name, None) if name != _FREE else None
    if name == "tpu" and getattr(module, "__name__", None) == _OURS:
        return
    sites = _kernel_sites()
    if name == _FREE and not sites:
        return
    owner = _owner(module, sites)
    by = f" by {owner}" if owner else " (owner not identified)"
    if name == _FREE:
        source = f"PrivateUse1 kernels are already registered{by}"
    elif name == "tpu":
        source = f"a 'tpu' backend is already registered{by}"
    else:
        source = f"PrivateUse1 is already registered as {name!r}{by}"
    autoloaded = [p for p in _autoloaded_plugins() if owner is None or p[2] == owner]
    if autoloaded:
        listed = ", ".join(f"entry point {ep!r} of {dist}" for ep, dist, _ in autoloaded)
        backend = "PrivateUse1 kernels" if name == _FREE else f"a {name!r} backend"
        source = f"{backend} ({owner or autoloaded[0][1]}) was autoloaded by torch at `import torch` ({listed})"
        remedy = ("set TORCH_DEVICE_BACKEND_AUTOLOAD=0 before torch is imported (in the shell, or "
                  "`import os; os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'] = '0'` in the first cell), "
                  "then restart the Python process / Jupyter kernel")
    else:
        remedy = ("restart the Python process / Jupyter kernel and import only one of the two "
                  "(if torch autoloads the other one, set TORCH_DEVICE_BACKEND_AUTOLOAD=0 first)")
    where = f" Its kernels are registered at {sites[0]}." if sites and not owner else ""
    raise BackendConflictError(
        f"tpu_interactive cannot register its 'tpu' device: {source}. torch has one PrivateUse1 backend "
        f"per process and two backends' kernels must not mix.{where} To use tpu_interactive: {remedy}.")


def _kernel_sites() -> list[str]:
    """Where PrivateUse1 kernels of aten ops were registered (``file:line``); a fresh torch has none."""
    sites = []
    for op in torch._C._dispatch_get_all_op_names():
        if op.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1"):
            for line in torch._C._dispatch_dump(op).splitlines():
                if line.startswith("PrivateUse1:"):
                    sites.append(line.split(" registered at ", 1)[-1].split(" :: ")[0].strip())
            if len(sites) >= 3:
                break
    if not sites and torch._C._dispatch_has_backend_fallback(torch._C.DispatchKey.PrivateUse1):
        sites.append("a PrivateUse1 fallback kernel (location unknown)")
    return sites


def _owner(module, sites: list[str]) -> str | None:
    """The top-level package that registered the device module, else the one whose file registered kernels."""
    if isinstance(module, types.ModuleType):
        return module.__name__.split(".")[0]
    if module is not None:
        return type(module).__module__.split(".")[0]
    for site in sites:
        path = os.path.realpath(site.rsplit(":", 1)[0])
        for mod_name, mod in list(sys.modules.items()):
            if getattr(mod, "__file__", None) and os.path.realpath(mod.__file__) == path:
                return mod_name.split(".")[0]
    return None


def _autoloaded_plugins() -> list[tuple[str, str, str]]:
    """(entry point, distribution, top-level module) of the backends torch autoloaded at import."""
    if os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":  # torch's own switch, same test
        return []
    found = []
    for ep in metadata.entry_points(group="torch.backends"):
        dist = ep.dist.name if ep.dist is not None else ep.module.split(".")[0]
        found.append((ep.name, dist, ep.module.split(".")[0]))
    return found
