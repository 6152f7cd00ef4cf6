"""Differential helpers: run the same function on CPU and on tpu inputs, compare results."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

TPU = torch.device("tpu", 0)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")

# ---------------------------------------------------------------- tolerances: the one table
# How close a tpu result must be to CPU's, by result dtype; every comparison helper reads it.
# float32/float64: torch.testing's defaults (a few ulps: XLA may round or accumulate in another order).
# bfloat16/float16: float32's numbers, i.e. the same bits in practice: both sides compute in float32
# and round once. Integer, bool and other results: exact.
_F32 = dict(rtol=1.3e-6, atol=1e-5)
_F64 = dict(rtol=1e-7, atol=1e-7)
TOL = {torch.float64: _F64, torch.complex128: _F64, torch.float32: _F32, torch.complex64: _F32,
       torch.bfloat16: _F32, torch.float16: _F32}
EXACT = dict(rtol=0, atol=0)

# Named exceptions (tol="name"): per dtype ("float" covers the floating/complex dtypes not listed),
# each with its reason. A looser value than these in a test needs a comment saying why.
NAMED_TOL: dict[str, dict] = {
    # data movement (indexing, copies, pooling maxima, views) and exactly rounded ops: the same bits
    "exact": dict(float=EXACT),
    # math functions and gradients: XLA's vectorized exp/log/pow/erf/tanh... and backward formulas
    # differ from ATen's by a few float32 ulps; a bfloat16 result computed from such float32 values
    # can round to the neighbouring bfloat16 (2^-8 relative), which near zero (after cancellation)
    # is an absolute error too
    "ulps": dict(float=dict(rtol=1e-5, atol=1e-5), float64=_F64, bfloat16=dict(rtol=2e-2, atol=2e-2)),
    # long float32 chains (factorizations, solves, matrix functions, distances, long reductions): XLA's
    # algorithms and blocking differ from LAPACK's/ATen's and the error grows with the conditioning
    "accumulated": dict(float=dict(rtol=1e-4, atol=1e-5)),
    # amplified rounding: large derivatives (tan near pi/2, lgamma/digamma near poles, atanh/logit near
    # +-1, x ** y) and sums with cancellation (convolution weight gradients, FFTs, gradients through
    # factorizations), where a few ulps of the largest term land on small results
    "loose": dict(float=dict(rtol=1e-4, atol=1e-4), bfloat16=dict(rtol=3e-2, atol=3e-2)),
    # special functions over wide ranges (ops/special.py, cephes' series): values span many magnitudes,
    # hence a small absolute floor; float64 runs the same float64 series as ATen, so 1e-12
    "special": dict(float=dict(rtol=2e-5, atol=1e-6), float64=dict(rtol=1e-12, atol=1e-14)),
}


def tol_for(dtype: torch.dtype | None, tol: str | dict | None = None) -> dict:
    """rtol/atol for a result of ``dtype``: the table's default, a named exception, or an explicit dict."""
    if isinstance(tol, dict):
        return tol
    if dtype is None or not (dtype.is_floating_point or dtype.is_complex):
        return EXACT
    if tol is None:
        return TOL.get(dtype, _F32)
    named = NAMED_TOL[tol]
    return named.get(str(dtype).removeprefix("torch."), named["float"])


def slow(*values, id: str | None = None):
    """One parametrization that runs only with ``-m slow``: a heavier twin of a default case (another
    dtype or shape of the same check). The default run is CI's bounded subset."""
    return pytest.param(*values, marks=pytest.mark.slow, id=id)


def to_tpu(value):
    if isinstance(value, torch.Tensor):
        out = value.detach().to(TPU)
        return out.requires_grad_(value.requires_grad) if value.is_leaf else out
    if isinstance(value, (list, tuple)):
        return type(value)(to_tpu(v) for v in value)
    if isinstance(value, dict):
        return {k: to_tpu(v) for k, v in value.items()}
    return value


def to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def assert_same(actual, expected, rtol=None, atol=None, check_dtype=True, tol: str | dict | None = None):
    """``actual`` (from tpu) equals ``expected`` (from CPU): values, shapes, dtypes, on tpu. Tolerances
    follow each expected tensor's dtype (``tol_for``); explicit ``rtol``/``atol`` override them."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == "tpu", f"result is on {actual.device}, expected tpu"
        limits = dict(tol_for(expected.dtype, tol))
        limits.update({k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None})
        torch.testing.assert_close(actual.cpu(), expected, **limits, check_dtype=check_dtype, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol, atol, check_dtype, tol)
    else:
        assert actual == expected or (actual != actual and expected != expected), f"{actual} != {expected}"


def floats(value) -> list:
    """Every floating-point tensor in a (nested) tuple/list result, in order."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in floats(v)]
    return []


def check(fn, *inputs, rtol=None, atol=None, tol: str | dict | None = None, **kwargs):
    """Run ``fn`` on CPU inputs and on copies moved to tpu; assert the results agree (``assert_same``)."""
    expected = fn(*inputs, **kwargs)
    actual = fn(*to_tpu(inputs), **to_tpu(kwargs))
    assert_same(actual, expected, rtol, atol, tol=tol)
    return actual, expected


def rand(*shape, seed=0, dtype=torch.float32):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return t.to(dtype) if dtype.is_floating_point else (t * 10).to(dtype)


def grad_check(fn, *inputs, rtol=None, atol=None, tol: str | dict | None = "ulps", seed=7):
    """Forward values and the .grad of every floating-point tensor input (one fixed random cotangent)
    agree with CPU autograd; other inputs (integer tensors, Python values) are passed as they are."""
    def leaf(x, device):
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(device, copy=True).requires_grad_(x.is_floating_point() or x.is_complex())

    cpu, dev = [leaf(x, "cpu") for x in inputs], [leaf(x, TPU) for x in inputs]
    expected, actual = fn(*cpu), fn(*dev)
    assert_same(actual, expected.detach(), rtol, atol, tol=tol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(seed), dtype=expected.dtype)
    expected.backward(g)
    actual.backward(g.to(TPU))
    for c, d in zip(cpu, dev):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            if c.grad is None:  # the result does not depend on it: no gradient on CPU either
                assert d.grad is None, "a tpu input got a gradient CPU does not give"
                continue
            assert d.grad is not None, "no gradient reached a tpu input"
            assert_same(d.grad, c.grad, rtol, atol, tol=tol)


def module_grad_check(module, x, rtol=None, atol=None, tol: str | dict | None = "ulps"):
    """A module's output, input grad and parameter grads agree between CPU and a tpu copy of it."""
    dev_module = copy.deepcopy(module).to(TPU)
    xc = x.clone().requires_grad_(True)
    xd = x.to(TPU).requires_grad_(True)
    expected, actual = module(xc), dev_module(xd)
    assert_same(actual, expected.detach(), rtol, atol, tol=tol)
    g = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected.backward(g)
    actual.backward(g.to(TPU))
    assert_same(xd.grad, xc.grad, rtol, atol, tol=tol)
    for (name, pc), (_, pd) in zip(module.named_parameters(), dev_module.named_parameters()):
        assert pd.grad is not None, f"no grad for {name}"
        assert_same(pd.grad, pc.grad, rtol, atol, tol=tol)


# An op with only a CPU kernel: the stable example of an op the tpu backend cannot lower
# (any real aten op might gain a lowering later).
_cpu_only_lib = torch.library.Library("tpu_test", "DEF")
_cpu_only_lib.define("cpu_only_scale(Tensor x, float factor) -> Tensor")
_cpu_only_lib.impl("cpu_only_scale", lambda x, factor: x * factor, "CPU")
cpu_only_scale = torch.ops.tpu_test.cpu_only_scale


def move(value):
    """To tpu, except 0-dim cpu tensors marked by wrapping them in a tuple ("keep on cpu")."""
    if isinstance(value, tuple):
        return value[0]
    return to_tpu(value)


def unmark(value):
    return value[0] if isinstance(value, tuple) else value


def raises_like_cpu(fn, *args, expected: type[BaseException] = RuntimeError, **kwargs) -> str:
    """CPU raises (an ``expected``); tpu copies of the arguments (as ``both`` moves them) raise the same
    exception type whose message contains CPU's first line: PyTorch's own words. Returns tpu's message."""
    with pytest.raises(expected) as cpu:
        fn(*[unmark(a) for a in args], **kwargs)
    return str(_raises_like(cpu.value, fn, args, kwargs, message=True))


def _raises_like(cpu_error: BaseException, fn, args, kwargs, message: bool) -> BaseException:
    with pytest.raises(type(cpu_error)) as raised:
        fn(*[move(a) for a in args], **kwargs)
        torch.tpu.synchronize()  # fused eager mode raises value-check errors when the ops run
    if message:
        first = str(cpu_error).strip().splitlines()[0]
        assert first == str(raised.value).strip().splitlines()[0], f"CPU: {first!r}\ntpu: {str(raised.value)!r}"
    return raised.value


def both(fn, *args, tol: str | dict | None = "ulps", message=False, **kwargs):
    """Run ``fn`` on CPU and on tpu copies; equal results, or the same exception type (and with
    ``message``, tpu's message contains CPU's first line: PyTorch's own words).

    The tolerance follows the result dtype (``tol_for``): exact for integers/bool, "ulps" for floats."""
    cpu_args = [unmark(a) for a in args]
    try:
        expected = fn(*cpu_args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the tpu must fail the same way
        _raises_like(exc, fn, args, kwargs, message)
        return None
    actual = fn(*[move(a) for a in args], **kwargs)
    assert_same(actual, expected, tol=tol)
    return actual


def needs_aten(name: str):
    """Skip a test of aten::``name`` only on a torch release that removed the op (torch 2.14 dropped
    aten::cholesky); the reason names the release and the registry's record of the skipped lowering."""
    import pytest

    from tpu_interactive.backend import registry

    packet = name.split(".")[0]
    missing = not hasattr(torch.ops.aten, packet)
    reason = registry.skipped().get(f"aten::{registry.canonical(name)}", "")
    return pytest.mark.skipif(missing, reason=f"torch {torch.__version__} removed aten::{packet} ({reason})")


# ---------------------------------------------------------------- notebooks
def run_result_script(script: str, env: dict[str, str], timeout: int = 300) -> dict:
    """Run ``script`` in a fresh interpreter (this checkout first on its path; the environment plus
    ``env``) and return the JSON its ``RESULT `` line printed."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)  # keep the caller's too
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": path, **env},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def stored_notebook(name: str):
    """notebooks/``name`` as stored: a valid notebook whose code cells have no outputs."""
    import nbformat

    book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} is stored with outputs"
    return book


def execute_notebook(name: str, timeout: int = 300):
    """Run notebooks/``name`` top to bottom in a fresh python3 kernel that imports this checkout (nbclient);
    returns the executed notebook. The kernel starts in notebooks/, as Jupyter would start it."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    from nbclient import NotebookClient

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:  # jupyter_client maps the kernelspec's argv 'python' to this interpreter
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
                       check=True, capture_output=True)
    book = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + saved if saved else "")  # the kernel inherits it
    try:
        NotebookClient(book, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": NOTEBOOKS}}).execute()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = saved
    return book


def fused_runs(before: dict) -> list[dict]:
    """Fused mode's segment runs (tpu_interactive.stats()'s recent_fused) since the stats ``before``."""
    import tpu_interactive

    after = tpu_interactive.stats()
    n = after["fused_segments"] - before["fused_segments"]
    return after["recent_fused"][-n:] if n else []
