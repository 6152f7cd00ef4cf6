"""Another backend already owns PrivateUse1 (or a 'tpu' device): one clear error, no mixed kernels.

Each case runs in a fresh interpreter: the PrivateUse1 name and its kernels are process-global.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import ROOT


# Stand-ins for other backends, imported before tpu_interactive (as a user or torch's autoload would).
FOREIGN = {
    # torchax-like: PrivateUse1 renamed to 'jax', with a device module
    "fake_jax_backend": """
        import types, torch
        torch.utils.rename_privateuse1_backend("jax")
        torch._register_device_module("jax", types.ModuleType("fake_jax_backend.device"))
    """,
    # a TorchTPU-like 'tpu' backend: the same name as ours, its own device module and kernels
    "fake_torch_tpu": """
        import types, torch
        torch.utils.rename_privateuse1_backend("tpu")
        torch._register_device_module("tpu", types.ModuleType("fake_torch_tpu.device"))
        _lib = torch.library.Library("aten", "IMPL")
        _lib.impl("add.Tensor", lambda a, b, alpha=1: a, "PrivateUse1")
    """,
    # kernels for PrivateUse1 without renaming it
    "fake_kernels": """
        import torch
        _lib = torch.library.Library("aten", "IMPL")
        _lib.impl("mul.Tensor", lambda a, b: a, "PrivateUse1")
    """,
    # a plugin torch loads itself at `import torch` through the 'torch.backends' entry point
    "fake_tpu_plugin": """
        import types, torch
        def autoload():
            torch.utils.rename_privateuse1_backend("tpu")
            torch._register_device_module("tpu", types.ModuleType("fake_tpu_plugin.device"))
    """,
}

# After a refused import: which PrivateUse1 kernels exist, to prove none of ours were added.
REPORT = """
try:
    import tpu_interactive
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
import torch
print("OURS", [op for op in ("aten::mm", "aten::add.Tensor", "aten::empty.memory_format")
               if "tpu_interactive" in torch._C._dispatch_dump(op)])
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("foreign")
    for name, source in FOREIGN.items():
        (path / name).mkdir()
        (path / name / "__init__.py").write_text(textwrap.dedent(source))
    info = path / "fake_tpu_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tpu-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nfake_tpu = fake_tpu_plugin:autoload\n")
    return path


def run(code: str, site=None, **env) -> subprocess.CompletedProcess:
    path = [ROOT] + ([str(site)] if site else []) + [p for p in [os.environ.get("PYTHONPATH")] if p]
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **env}
    full_env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False)


REMEDY = "restart the Python process / Jupyter kernel and import only one of the two"


@pytest.mark.parametrize("foreign, message", [
    ("fake_jax_backend", "PrivateUse1 is already registered as 'jax' by fake_jax_backend."),
    ("fake_torch_tpu", "a 'tpu' backend is already registered by fake_torch_tpu."),
    ("fake_kernels", "PrivateUse1 kernels are already registered by fake_kernels."),
])
def test_foreign_backend_imported_first_is_one_clear_error(site, foreign, message):
    out = run(f"import {foreign}\n" + REPORT, site, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.returncode == 0, out.stderr
    error = next(line for line in out.stdout.splitlines() if line.startswith("ERROR"))
    assert error.startswith("ERROR BackendConflictError tpu_interactive cannot register its 'tpu' device: "
                            + message), error
    assert REMEDY in error and "already been set" not in error  # not torch's raw registration error
    assert "OURS []" in out.stdout  # none of our kernels were registered next to theirs


def test_autoloaded_tpu_backend_names_it_and_the_remedy_works(site):
    out = run(REPORT, site)  # torch itself imports fake_tpu_plugin at `import torch`
    assert out.returncode == 0, out.stderr
    assert ("ERROR BackendConflictError tpu_interactive cannot register its 'tpu' device: a 'tpu' backend "
            "(fake_tpu_plugin) was autoloaded by torch at `import torch` (entry point 'fake_tpu' of "
            "fake-tpu-plugin)") in out.stdout, out.stdout
    assert "set TORCH_DEVICE_BACKEND_AUTOLOAD=0 before torch is imported" in out.stdout
    assert "OURS []" in out.stdout

    # the remedy the error names: without autoload, the same environment imports us and computes
    remedy = run("""
        import torch, tpu_interactive
        x = torch.arange(6.0).reshape(2, 3)
        print("RESULT", (x.to("tpu") @ x.T.to("tpu")).cpu().tolist(), (x @ x.T).tolist())
    """, site, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert remedy.returncode == 0, remedy.stderr
    line = next(line for line in remedy.stdout.splitlines() if line.startswith("RESULT"))
    tpu, cpu = line[len("RESULT "):].split("] [")
    assert tpu + "]" == "[" + cpu, line


def test_newer_torch_warns_once_and_reimport_or_reload_is_harmless():
    """A torch newer than the tested range imports and warns once; importing again, reloading the
    package or its registration module and `%reload_ext` change nothing and keep working."""
    out = run("""
        import importlib, warnings
        import torch
        torch.__version__ = torch.torch_version.TorchVersion("2.99.0")  # a release newer than tested
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tpu_interactive
            import tpu_interactive as again
            from tpu_interactive.backend import _register
            importlib.reload(tpu_interactive)
            importlib.reload(_register).register()
            from IPython.core.interactiveshell import InteractiveShell
            shell = InteractiveShell.instance()
            for line in ("%load_ext tpu_interactive", "%reload_ext tpu_interactive",
                         "import torch; y = (torch.arange(6.0).reshape(2, 3).to('tpu') * 2).sum(0).cpu()"):
                assert shell.run_cell(line).success, line
        untested = [str(w.message) for w in caught if w.category.__name__ == "UntestedVersionWarning"]
        print("WARNINGS", len(untested), untested[0])
        print("RESULT", shell.user_ns["y"].tolist())
        print("NAME", torch._C._get_privateuse1_backend_name(), torch.tpu.__name__)
    """)
    assert out.returncode == 0, out.stderr
    assert "WARNINGS 1 tpu_interactive is tested with torch 2.13.0 and 2.14.1" in out.stdout, out.stdout
    assert "installed torch 2.99.0 is newer" in out.stdout
    expected = (torch.arange(6.0).reshape(2, 3) * 2).sum(0).tolist()
    assert f"RESULT {expected}" in out.stdout
    assert "NAME tpu tpu_interactive.backend.device_module" in out.stdout
