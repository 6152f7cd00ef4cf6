"""Version drift: lowerings bound to torch releases, ops a torch release lacks, the tested range."""
from __future__ import annotations

import warnings

import pytest
import torch

from tpu_interactive.backend import registry, versions
from tpu_interactive.session import summary


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(registry, "LOWERINGS", {})
    monkeypatch.setattr(registry, "SKIPPED", {})


def test_lowering_outside_its_torch_versions_or_for_a_missing_op_is_skipped_and_listed(scratch_registry):
    def fn(a):
        return a

    registry.lower("abs", torch_versions=f">={registry.TORCH_VERSION}")(fn)
    registry.lower("neg", torch_versions=f"<{registry.TORCH_VERSION}")(fn)
    registry.lower("op_this_torch_does_not_have.Tensor")(fn)
    registry.pallas_variant("neg", covers=lambda *a: True)(fn)  # a Pallas variant of a skipped lowering is dropped with it
    assert list(registry.LOWERINGS) == ["abs.default"]
    assert registry.skipped() == {
        "aten::neg.default": f"lowering applies to torch<{registry.TORCH_VERSION}; installed torch is "
                             f"{registry.TORCH_VERSION}",
        "aten::op_this_torch_does_not_have.Tensor": "aten::op_this_torch_does_not_have.Tensor does not exist "
                                                    f"in the installed torch {registry.TORCH_VERSION}",
    }
    text = summary.skipped_text()
    assert f"lowerings skipped with torch {registry.TORCH_VERSION}" in text
    assert "aten::neg.default: lowering applies to torch<" in text
    with pytest.raises(ValueError, match="duplicate lowering for aten::neg.default"):
        registry.lower("neg")(fn)


def test_only_declared_skips_on_a_tested_torch():
    """A lowering of an op the installed torch lacks is skipped, never an import error; on a tested
    torch every skip must be declared with torch_versions (an undeclared one is a misspelt op name)."""
    tested = not versions.untested()
    for op, reason in registry.skipped().items():
        packet = op[len("aten::"):].split(".")[0]
        if reason.startswith("lowering applies to torch"):
            continue
        assert not tested, f"{op}: {reason} (misspelt, or declare torch_versions= on its lowering)"
        assert not hasattr(torch.ops.aten, packet), op


def test_cholesky_lowering_follows_the_installed_torch():
    """torch 2.14 removed aten::cholesky: its lowering is registered exactly where torch has the op."""
    has_op = hasattr(torch.ops.aten, "cholesky")
    assert ("cholesky.default" in registry.LOWERINGS) == has_op
    assert ("aten::cholesky.default" in registry.skipped()) == (not has_op)
    assert ("aten::cholesky.default" in summary.skipped_text()) == (not has_op)


@pytest.mark.parametrize("installed, newer", [("2.13.0+cpu", False), ("2.14.1+cu130", False), ("2.14.3", False),
                                              ("2.15.0", True), ("3.0.0a0", True), ("2.12.1", False)])
def test_newer_than_tested(installed, newer):
    assert versions._newer(installed, versions.TESTED_TORCH) is newer


def test_warns_once_only_for_an_untested_release(monkeypatch):
    monkeypatch.setattr(versions, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.warn_if_untested()  # the installed releases are tested ones
        assert caught == []
        monkeypatch.setattr(torch, "__version__", "2.15.0")
        versions.warn_if_untested()
        versions.warn_if_untested()
    assert [w.category for w in caught] == [versions.UntestedVersionWarning]
    assert "tested with torch 2.13.0 and 2.14.1" in str(caught[0].message)
    assert "installed torch 2.15.0 is newer" in str(caught[0].message)


def test_declared_ranges_match_what_ci_tests():
    """pyproject's ranges, .ci/run's torch venv and versions.TESTED_* say the same thing."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml")) as f:
        deps = re.findall(r'^  "([^"]+)",$', f.read().split("dependencies = [", 1)[1].split("]", 1)[0], re.M)
    assert "torch>=2.13" in deps  # no upper pin: a newer torch is used, not replaced
    assert f"jax>={versions.TESTED_JAX[0]}" in deps and f"jaxlib>={versions.TESTED_JAX[0]}" in deps
    assert versions.TESTED_TORCH[0].startswith("2.13.")
    with open(os.path.join(root, ".ci", "run")) as f:
        ci = f.read()
    assert re.search(rf"^TORCH_NEW={re.escape(versions.TESTED_TORCH[-1])}\b", ci, re.M)
