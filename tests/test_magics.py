"""The IPython extension, driven through a real InteractiveShell."""
import re
import warnings

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import tpu_interactive
from tpu_interactive.backend import stats as backend_stats
from tpu_interactive.session.tracker import TRACKER

_lib = torch.library.Library("tpu_magics_test", "DEF")  # an op with only a CPU kernel: always falls back
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext tpu_interactive")
    shell.run_cell("import torch, tpu_interactive")
    yield shell
    shell.run_cell("%unload_ext tpu_interactive")


def run(ip, capsys, code):
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = ip.run_cell(code)
    return result, capsys.readouterr().out


def test_load_banner_and_registration(capsys):
    shell = InteractiveShell.instance()
    shell.run_cell("%unload_ext tpu_interactive")  # in case an earlier module loaded it
    capsys.readouterr()
    shell.run_cell("%load_ext tpu_interactive")
    out = capsys.readouterr().out
    info = tpu_interactive.backend_info()
    banner = [line for line in out.splitlines() if info.summary in line]
    assert len(banner) == 1 and "%%tpu" in banner[0]
    assert out.count("WARNING") == len(info.warnings)
    assert "tpu" in shell.magics_manager.magics["line"] and "tpu" in shell.magics_manager.magics["cell"]
    posts = len(shell.events.callbacks["post_run_cell"])
    shell.run_cell("%unload_ext tpu_interactive")
    assert "tpu" not in shell.magics_manager.magics["line"] and "tpu" not in shell.magics_manager.magics["cell"]
    assert len(shell.events.callbacks["post_run_cell"]) == posts - 1
    assert "%tpu" not in shell.strdispatchers["complete_command"].strs
    result = shell.run_cell("%tpu status")
    assert isinstance(result.error_in_exec, UsageError)
    shell.run_cell("%load_ext tpu_interactive")  # loads again after an unload
    assert len(shell.events.callbacks["post_run_cell"]) == posts


@pytest.mark.eager_only  # checks plain eager's compile report for a new shape
def test_cell_runs_on_tpu_and_restores_default_device(ip, capsys):
    result, out = run(ip, capsys, "%%tpu\nx = torch.ones(64, 31)\ny = (x @ x.T).sum()\ny.item()")
    assert result.success and result.result == 64 * 64 * 31
    assert ip.user_ns["x"].device.type == "tpu"
    assert torch.get_default_device().type == "cpu"
    assert torch.ones(1).device.type == "cpu"
    assert re.search(r"\[tpu\] cell: [\d.]+ (s|ms|us) wall", out)
    ops = re.search(r"ops +(\d+) executed", out)
    assert ops and int(ops.group(1)) >= 3 and "mm x1" in out
    # a shape no other test uses: its ops' XLA programs are compiled (or loaded from disk) in this cell
    compiles = re.search(r"compiles +(\d+) XLA programs? \(.*% of the cell", out)
    assert compiles and int(compiles.group(1)) >= 1, out
    assert "fallbacks  none" in out
    assert "device->host 1 (4 B)" in out  # y.item() reads one float32
    mem = re.search(r"memory +\+([\d.]+ \w+) -> ", out)
    assert mem and "cell peak" in out


def test_report_counts_transfers_and_memory_exactly(ip, capsys):
    result, out = run(ip, capsys, "%%tpu\nbig = torch.tensor([1.0, 2.0, 3.0, 4.0]).to('tpu')\nbig2 = big * 2")
    assert result.success
    assert "host->device 1 (16 B)" in out
    assert "memory     +32 B" in out


def test_restores_after_exception_and_shows_user_line(ip, capsys):
    ip.run_cell("import torch, torch.nn as nn\nlayer = nn.Linear(8, 4).to('tpu')")
    sync_before = tpu_interactive.config.sync
    result, out = run(ip, capsys, "%%tpu --sync\ngood = torch.randn(2, 8)\nbad = torch.randn(2, 5)\nout = layer(bad)\n")
    assert isinstance(result.error_in_exec, RuntimeError)
    message = str(result.error_in_exec)
    assert "aten::addmm" in message and "out = layer(bad)" in message
    assert "error      RuntimeError in aten::addmm" in out
    assert "at cell line 4: out = layer(bad)" in out  # line 1 is the %%tpu line
    assert torch.get_default_device().type == "cpu"
    assert tpu_interactive.config.sync == sync_before
    result, _ = run(ip, capsys, "%%tpu\nok = layer(good).shape")  # the kernel is still usable
    assert result.success and ip.user_ns["ok"] == (2, 4)


def test_nan_check_reports_the_op(ip, capsys):
    result, out = run(ip, capsys, "%%tpu --nan-check\nv = torch.tensor([1.0, -1.0])\nw = torch.log(v)\n")
    assert type(result.error_in_exec).__name__ == "NonFiniteError"
    assert "aten::log" in str(result.error_in_exec) and "NaN" in str(result.error_in_exec)
    assert "at cell line 3: w = torch.log(v)" in out
    assert tpu_interactive.config.nan_check is False
    result, _ = run(ip, capsys, "w = torch.log(torch.tensor([-1.0], device='tpu'))")  # off again: no raise
    assert result.success and torch.isnan(ip.user_ns["w"].cpu()).all()


@pytest.mark.parametrize("options, expected", [
    ("", (False, False)), ("--sync", (True, False)), ("--pallas on", (False, True)),
    ("--nan-check --pallas off", (False, False)), ("--profile", (True, False)),
])
def test_switches_apply_to_the_cell_only(ip, capsys, options, expected):
    tpu_interactive.config.sync = tpu_interactive.config.pallas = False
    result, _ = run(ip, capsys, f"%%tpu --quiet {options}\nseen = (tpu_interactive.config.sync, "
                                 "tpu_interactive.config.pallas, tpu_interactive.config.nan_check)")
    assert result.success
    assert ip.user_ns["seen"][:2] == expected
    assert ip.user_ns["seen"][2] == ("--nan-check" in options)
    cfg = tpu_interactive.config
    assert (cfg.sync, cfg.pallas, cfg.nan_check) == (False, False, False)


def test_no_sync_overrides_global_sync(ip, capsys):
    tpu_interactive.config.sync = True
    result, out = run(ip, capsys, "%%tpu --no-sync\nseen = tpu_interactive.config.sync")
    assert result.success and ip.user_ns["seen"] is False and "sync off" in out
    assert tpu_interactive.config.sync is True


@pytest.mark.parametrize("line", ["--bogus", "--pallas maybe", "--sync --no-sync", "--no-sync --nan-check", "'"])
def test_bad_cell_options_are_usage_errors(ip, capsys, line):
    ip.user_ns.pop("ran", None)
    result, out = run(ip, capsys, f"%%tpu {line}\nran = True")
    assert isinstance(result.error_in_exec, UsageError)
    assert "ran" not in ip.user_ns


def test_help_prints_usage_without_running(ip, capsys):
    ip.user_ns.pop("ran", None)
    result, out = run(ip, capsys, "%%tpu --help\nran = True")
    assert result.success and "ran" not in ip.user_ns
    for option in ("--sync", "--no-sync", "--nan-check", "--pallas", "--compile", "--profile", "--quiet"):
        assert option in out
    assert "jax.profiler" in out  # --profile documents what it measures
    _, out = run(ip, capsys, "%tpu help")
    assert "placement" in out and "--nan-check" in out


def test_quiet_prints_nothing(ip, capsys):
    result, out = run(ip, capsys, "%%tpu --quiet\nq = torch.zeros(3)")
    assert result.success and out == "" and ip.user_ns["q"].device.type == "tpu"


def test_profile_lists_per_op_time(ip, capsys):
    result, out = run(ip, capsys, "%%tpu --profile\na = torch.randn(16, 16)\nb = a @ a\nc = b.relu()")
    assert result.success
    assert "per-op device time" in out and "sync on" in out
    table = out.split("per-op device time")[1]
    assert re.search(r"\bmm +1 ", table) and "share" in table


def test_fallbacks_are_listed(ip, capsys):
    ip.user_ns["twice"] = torch.ops.tpu_magics_test.twice
    result, out = run(ip, capsys, "%%tpu\nt2 = twice(torch.ones(3))")
    assert result.success
    assert "fallbacks  1 op call ran on CPU: tpu_magics_test::twice x1" in out
    _, out = run(ip, capsys, "%tpu fallbacks")
    assert "tpu_magics_test::twice.default" in out


def test_compile_option_lists_compile_events(ip, capsys):
    code = ("%%tpu --compile\nfrom tpu_interactive.backend import stats as _s\n"
            "_s.record_compile('mlp_forward', 'first call', 0.25, False)\n"
            "_s.record_compile('mlp_forward', 'cache hit', 0.0, True)")
    result, out = run(ip, capsys, code)
    assert result.success
    assert "torch.compile graphs: 1 compiled, 1 cached" in out
    events = out.split("compile events:")[1]
    assert "mlp_forward" in events and "first call" in events and "miss" in events and "hit" in events


def test_status_sync_pallas_subcommands(ip, capsys):
    _, out = run(ip, capsys, "%tpu status")
    assert tpu_interactive.backend_info().summary in out and "sync off" in out
    _, out = run(ip, capsys, "%tpu sync on")
    assert out.strip() == "sync mode on" and tpu_interactive.config.sync is True
    _, out = run(ip, capsys, "%tpu status")
    assert "sync on" in out
    run(ip, capsys, "%tpu sync off")
    assert tpu_interactive.config.sync is False
    run(ip, capsys, "%tpu pallas on")
    assert tpu_interactive.config.pallas is True
    _, out = run(ip, capsys, "%tpu pallas")
    assert out.strip() == "pallas on"
    run(ip, capsys, "%tpu pallas off")
    run(ip, capsys, "%tpu nan-check on")
    assert tpu_interactive.config.nan_check is True
    run(ip, capsys, "%tpu nan-check off")
    assert tpu_interactive.config.nan_check is False


@pytest.mark.parametrize("line", ["%tpu bogus", "%tpu sync maybe", "%tpu pallas on off", "%tpu memory now",
                                  "%tpu cache flush", "%tpu ops many", "%tpu status extra", "%tpu 'unclosed"])
def test_bad_line_arguments_are_usage_errors(ip, capsys, line):
    result, _ = run(ip, capsys, line)
    assert isinstance(result.error_in_exec, UsageError)


def test_memory_and_placement_name_variables(ip, capsys):
    ip.run_cell("import torch.nn as nn\nweights = torch.zeros(256, 256, device='tpu')\n"
                "alias = weights[:10]\nhost = torch.ones(3)\nnet = nn.Linear(4, 2).to('tpu')\n"
                "net.bias.data = net.bias.data.cpu()")
    _, out = run(ip, capsys, "%tpu memory")
    assert "bytes in use" in out
    row = next(line for line in out.splitlines() if "weights" in line)
    assert "alias" in row and "(256, 256)" in row and "256.00 KiB" in row and "float32" in row
    _, out = run(ip, capsys, "%tpu placement")
    assert re.search(r"net \(mixed!\) +cpu, tpu:0", out)
    assert re.search(r"host +cpu +\(3,\)", out)
    assert re.search(r"weights +tpu:0 +\(256, 256\) +float32 +256.00 KiB +no", out)


def test_cache_ops_reset(ip, capsys, monkeypatch):
    import tpu_interactive.backend.compiler as compile_mod

    calls = []
    monkeypatch.setattr(compile_mod, "clear_cache", lambda: calls.append(1))
    backend_stats.record_compile("g", "new input shape", 0.5, False)
    _, out = run(ip, capsys, "%tpu cache")
    assert "misses" in out and "new input shape" in out
    _, out = run(ip, capsys, "%tpu cache clear")
    assert calls == [1] and "cleared" in out
    _, out = run(ip, capsys, "%tpu reset")
    s = tpu_interactive.stats()
    assert sum(s["op_counts"].values()) == 0 and s["compile_misses"] == 0 and "reset" in out
    run(ip, capsys, "x2 = torch.ones(5, device='tpu') + 1")
    _, out = run(ip, capsys, "%tpu ops 3")
    assert re.search(r"add.Tensor +1 ", out) and "count" in out


def test_tab_completion(ip):
    assert set(ip.complete("s", "%tpu s", 6)[1]) == {"status", "sync"}
    assert ip.complete("", "%tpu sync ", 10)[1] == ["on", "off"]
    assert ip.complete("c", "%tpu cache c", 12)[1] == ["clear"]
    assert "placement" in ip.complete("", "%tpu ", 5)[1]
    assert "--nan-check" in ip.complete("--n", "%%tpu --n", 9)[1]


def test_post_run_cell_tracks_each_cell(ip):
    ip.run_cell("tracked = torch.empty(1000, dtype=torch.float32, device='tpu')")
    assert TRACKER.last.memory_delta == 4000 and TRACKER.last.peak >= 4000
    ip.run_cell("del tracked")
    assert TRACKER.last.memory_delta == -4000


def test_dashboard_subcommand_in_terminal_prints_text(ip, capsys):
    # a tensor of its own: the variables table lists the namespace (other tests' names may not be there)
    ip.run_cell("dashboard_probe = torch.ones(5, device='tpu')")
    _, out = run(ip, capsys, "%tpu dashboard")
    assert "bytes in use" in out and "compile cache" in out and "variable" in out and "dashboard_probe" in out


def test_ops_lowerings_lists_the_registry(ip, capsys):
    from tpu_interactive.backend.registry import table

    _, out = run(ip, capsys, "%tpu ops --lowerings silu")
    expected = [r for r in table() if "silu" in r["op"]]
    assert out.splitlines()[0] == f"{len(expected)} lowerings of ops containing 'silu':"
    for row in expected:
        line = next(line for line in out.splitlines() if line.split()[:1] == [row["op"]])
        assert line.split()[1:5] == [row["module"], row["function"], row["promote"] or "-", row["dtypes"] or "any"]
    _, out = run(ip, capsys, "%tpu ops --lowerings mm.default")
    assert re.search(r"aten::mm.default +linalg +mm +result +any +pallas", out)
    _, out = run(ip, capsys, "%tpu ops --lowerings")
    assert out.splitlines()[0] == f"{len(table())} lowerings:"
    assert re.search(r"aten::view.default +core +view +- +any +raw", out)
    assert re.search(r"aten::nonzero.default +indexing +nonzero +- +any +data-dependent", out)
    result, _ = run(ip, capsys, "%tpu ops --lowerings a b")
    assert isinstance(result.error_in_exec, UsageError)
    assert "--lowerings" in ip.complete("", "%tpu ops ", 9)[1]
