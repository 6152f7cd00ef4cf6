"""IPython extension: ``%load_ext tpu_interactive`` registers ``%%tpu`` and ``%tpu``.

The helper modules (fmt, namespace, tracker, summary) import no IPython; only ``extension`` does,
and only when the extension is loaded.
"""
from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from .extension import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .extension import unload

    unload(ipython)


__all__ = ["load_ipython_extension", "unload_ipython_extension"]
