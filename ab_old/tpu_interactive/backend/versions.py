"""The torch/jax releases this package is tested with, and a one-time warning on newer ones."""
from __future__ import annotations

import warnings

import jax
import torch
from packaging.version import Version

PACKAGE_VERSION = "0.1.0"  # tpu_interactive.__version__ (pyproject.toml's version)

# CI runs the default suite on each (see docs/versions.md and .ci/run).
TESTED_TORCH = ("2.13.0", "2.14.1")
TESTED_JAX = ("0.6.2", "0.10.2")

_warned = False


class UntestedVersionWarning(UserWarning):
    """The installed torch or jax is newer than the releases tpu_interactive is tested with."""


def _release(version: str) -> Version:
    return Version(Version(version.split("+")[0]).base_version)


def _newer(installed: str, tested: tuple[str, ...]) -> bool:
    """Newer than the newest tested minor series (patch releases of it count as tested)."""
    newest = _release(tested[-1])
    return _release(installed).release[:2] > newest.release[:2]


def untested() -> list[str]:
    """'torch 2.15.0' etc. for each installed library newer than the tested range."""
    found = []
    for lib, tested in ((torch, TESTED_TORCH), (jax, TESTED_JAX)):
        if _newer(lib.__version__, tested):
            found.append(f"{lib.__name__} {lib.__version__}")
    return found


def warn_if_untested() -> None:
    global _warned
    newer = untested()
    if _warned or not newer:
        return
    _warned = True
    warnings.warn(
        f"tpu_interactive is tested with torch {' and '.join(TESTED_TORCH)} and jax {TESTED_JAX[0]} to "
        f"{TESTED_JAX[-1]}; the installed {' and '.join(newer)} is newer. It is expected to work: lowerings "
        "of ops this torch no longer has are skipped (tpu_interactive.backend.registry.skipped() and "
        "`%tpu ops` list them) and those ops run through torch's decompositions or the CPU fallback.",
        UntestedVersionWarning, stacklevel=2)
