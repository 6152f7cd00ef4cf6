"""Every XLA compile is seen: counted, timed, attributed to the aten op / graph, its input shapes and the
user's line; JAX's persistent compilation cache is on by default and a second process loads from it."""
import os
import re
import subprocess
import sys
import textwrap

import jax
import pytest
import torch
from packaging.version import Version

import tpu_interactive as tt
from tpu_interactive.backend import compile_log
from tpu_interactive.session import summary
from tpu_interactive.session.tracker import CellTracker

TPU = "tpu"


def _new_compiles(before: dict) -> list[dict]:
    n = tt.stats()["xla_compiles"] - before["xla_compiles"]
    return tt.stats()["recent_xla_compiles"][-n:] if n else []


@pytest.mark.eager_only
def test_eager_op_compile_is_attributed_to_op_shapes_and_user_line():
    x = torch.ones(3, 101, device=TPU)  # a shape no other test uses
    before = tt.stats()
    y = torch.special.erfcx(x); line = sys._getframe().f_lineno  # noqa: E702 - the line under test
    events = _new_compiles(before)
    assert events, "an op at a new shape compiled nothing"
    mine = [e for e in events if e["op"] == "aten::special_erfcx.default"]
    assert mine and mine[0]["shapes"] == "(3, 101) float32"
    assert mine[0]["where"] == f"{__file__}:{line}" and "erfcx" in mine[0]["source"]
    assert all(e["seconds"] > 0 for e in events)
    after = tt.stats()
    assert after["xla_compile_seconds"] > before["xla_compile_seconds"]
    assert after["xla_compile_counts"]["aten::special_erfcx.default"] >= len(mine)
    # warm: the same op at the same shape compiles nothing more
    before = tt.stats()
    torch.testing.assert_close(torch.special.erfcx(x).cpu(), torch.special.erfcx(torch.ones(3, 101)))
    assert tt.stats()["xla_compiles"] == before["xla_compiles"]
    del y


def test_compiled_graph_compiles_are_named_after_the_graph():
    before = tt.stats()
    fn = tt.compile(lambda a: torch.cos(a) * 5 - a)
    torch.testing.assert_close(fn(torch.ones(7, 13, device=TPU)).cpu(), torch.cos(torch.ones(7, 13)) * 5 - 1)
    ops = {e["op"] for e in _new_compiles(before)}
    assert any(op.startswith("torch.compile graph") for op in ops), ops


@pytest.mark.eager_only
def test_cell_report_counts_compiles_and_warns_once_about_shape_churn(monkeypatch):
    tracker = CellTracker()
    monkeypatch.setattr(summary, "TRACKER", tracker)
    lin = torch.nn.Linear(9, 5).to(TPU)
    measurement = tracker.measure()
    for n in (11, 12, 13, 14):  # one line, four new batch sizes
        lin(torch.ones(n, 9, device=TPU)).sum().item()
    delta = measurement.finish()
    lines = summary.compile_lines(delta)
    assert f"{delta.diff['xla_compiles']} XLA programs" in lines[0] and delta.diff["xla_compiles"] >= 4
    churn = [line for line in lines if "keeps compiling" in line]
    assert len(churn) == 1 and "test_compile_log.py" in churn[0] and "compiled for 4 different inputs" in churn[0]
    # which of the line's ops (addmm, sum) is named first depends on which one's compiles finished first
    assert re.search(r"\(11, [59]\) float32.*\] -> \[.*\(12, [59]\) float32", churn[0]), churn[0]
    # the advice is given once per line and session
    assert not any("keeps compiling" in line for line in summary.compile_lines(delta))


def _run(code: str, env: dict) -> str:
    # a fresh process, as a user starts one: neither our cache setting nor the XLA flags this one chose
    base = {k: v for k, v in os.environ.items() if k not in ("TPU_INTERACTIVE_CACHE_DIR", "XLA_FLAGS")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**base, **env},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


_STEP = """
    import os, torch, tpu_interactive as tt
    print("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    print(float((x.exp() @ x.T).sum()))
    s = tt.stats()
    print("compiles", s["xla_compiles"], "disk", s["xla_disk_hits"], "dir", tt.backend.compile_log.persistent_cache_dir())
"""


def test_persistent_cache_on_by_default_and_second_process_loads_from_disk(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    first = _run(_STEP, env)
    expected = float((torch.arange(12.0).reshape(3, 4).exp() @ torch.arange(12.0).reshape(3, 4).T).sum())
    flags, value, stats_line = first.strip().splitlines()[-3:]
    # XLA:CPU's faster-compiling emitters were chosen at import (eager compiles one program per op/shape)
    wanted = [compile_log.FAST_CPU_COMPILE_FLAG]
    if Version(jax.__version__) >= Version(compile_log._YNN_SINCE):
        wanted.insert(0, compile_log.NO_YNN_FUSION_FLAG)
    assert flags == f"XLA_FLAGS {' '.join(wanted)}"
    assert abs(float(value) - expected) < 1e-3 * abs(expected)
    assert f"dir {tmp_path / 'tpu_interactive' / 'jax'}" in stats_line and " disk 0 " in stats_line
    assert any((tmp_path / "tpu_interactive" / "jax").iterdir())
    second = _run(_STEP, env).strip().splitlines()
    compiles, disk = int(second[-1].split()[1]), int(second[-1].split()[3])
    assert float(second[-2]) == float(value)
    assert compiles > 0 and disk == compiles, second[-1]  # every program came from disk


def test_cache_switch_unwritable_directory_and_users_xla_flags(tmp_path):
    users = "--xla_cpu_use_fusion_emitters=true --xla_force_host_platform_device_count=2"
    flags, value, off = _run(_STEP, {"TPU_INTERACTIVE_CACHE_DIR": "", "XLA_FLAGS": users}).strip().splitlines()[-3:]
    assert off.endswith("dir None")
    # a user's own setting of the fast-compile flag is kept (the correctness flag is still added)
    ynn = f" {compile_log.NO_YNN_FUSION_FLAG}" if Version(jax.__version__) >= Version(compile_log._YNN_SINCE) else ""
    assert flags == f"XLA_FLAGS {users}{ynn}"
    expected = float((torch.arange(12.0).reshape(3, 4).exp() @ torch.arange(12.0).reshape(3, 4).T).sum())
    assert abs(float(value) - expected) < 1e-3 * abs(expected)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code = "import warnings; warnings.simplefilter('always')\n" + textwrap.dedent(_STEP)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TPU_INTERACTIVE_CACHE_DIR": str(blocker / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1].endswith("dir None")  # work went on, uncached
    assert result.stderr.count("is not writable") == 1, result.stderr[-2000:]


@pytest.mark.eager_only
def test_cache_text_lists_eager_and_graph_compiles():
    torch.ones(2, 103, device=TPU).log1p()
    text = summary.cache_text()
    assert "XLA programs compiled" in text and "log1p" in text and "torch.compile graph cache" in text
    assert str(compile_log.persistent_cache_dir() or "off") in text


@pytest.mark.eager_only
def test_jit_ops_one_program_per_op_matches_cpu_and_keeps_value_checks(monkeypatch):
    monkeypatch.setattr(tt.config, "jit_ops", True)
    x, w = torch.randn(4, 29), torch.randn(29)
    before = tt.stats()
    got = torch.nn.functional.layer_norm(x.to(TPU), (29,), w.to(TPU), w.to(TPU))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.layer_norm(x, (29,), w, w), rtol=1e-5, atol=1e-5)
    ln = [e for e in _new_compiles(before) if "layer_norm" in e["op"]]
    assert len(ln) == 1, ln  # the whole lowering is one program
    for value in (0.1, 0.25, 0.7):  # a float that changes every call is an input, not a cache key
        before = tt.stats()
        got = torch.ones(29, device=TPU).addcdiv(x[0].to(TPU), w.to(TPU), value=value)
        torch.testing.assert_close(got.cpu(), torch.ones(29).addcdiv(x[0], w, value=value))
        if value != 0.1:
            assert not any("addcdiv" in e["op"] for e in _new_compiles(before))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # a value check still runs (eagerly)
        torch.tensor([4, 5], device=TPU) // torch.tensor([1, 0], device=TPU)
    torch.manual_seed(3)
    a = torch.nn.functional.dropout(torch.ones(64, device=TPU), 0.5)
    b = torch.nn.functional.dropout(torch.ones(64, device=TPU), 0.5)
    assert not torch.equal(a.cpu(), b.cpu())  # the RNG is drawn per call, never baked into a program



def test_trim_deletes_least_recently_used_entries_down_to_80_percent(tmp_path):
    now = 1_700_000_000
    for i in range(10):  # entry i was last used at now + i; 100 bytes each
        path = tmp_path / f"jit_f-{i}-cache"
        path.write_bytes(b"x" * 100)
        (tmp_path / f"jit_f-{i}-atime").write_bytes(b"t")
        os.utime(path, (now + i, now + i))
    assert compile_log.trim(str(tmp_path), 1000) == 0  # at the cap: nothing to do
    assert compile_log.trim(str(tmp_path), 900) == 3  # 1000 bytes > 900: down to 720, oldest first
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"jit_f-{i}-cache" for i in range(3, 10)] + [f"jit_f-{i}-atime" for i in range(3, 10)])
