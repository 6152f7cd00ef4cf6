"""Run a callback right after a module is first imported, without importing it ourselves.

Registering the dynamo backend or teaching Accelerate the name ``"tpu"`` needs their modules, but
importing them at ``import tpu_interactive`` would cost seconds most sessions never need. One
``sys.meta_path`` finder wraps the target's loader instead; if the module is already imported, the
callback runs at once.
"""
from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType
from typing import Callable

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PENDING:
            return None
        for finder in sys.meta_path:  # whoever would have found it (site-packages, editable installs)
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, callbacks = spec.loader, _PENDING.pop(name)
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            if module.__name__ == name:  # a loader shared by several modules (zipimport) runs others too
                for callback in callbacks:
                    callback(module)

        loader.exec_module = exec_module
        return spec


_FINDER = _AfterImport()


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _PENDING.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
