"""Pallas kernels (interpret mode on CPU): Pallas path vs XLA path vs CPU torch, forward and backward,
on ragged (non-multiple-of-block) shapes; stats say which path each op took."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import TPU, assert_same, slow, to_tpu

import tpu_interactive as tt
from tpu_interactive.backend import kernels as P
from tpu_interactive.backend import stats as tstats

ATOL = 2e-5


def _rand(*shape, seed=0):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _close(a, b, atol=ATOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=atol)


def _paths(op):
    return dict(tt.stats()["kernel_paths"].get(op, {}))


# ---------------------------------------------------------------- kernels against XLA references
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((40, 33), (33, 70)), ((2, 9, 17), (2, 17, 5))])
def test_matmul_kernel_forward_and_vjp(shapes):
    x, y = _rand(*shapes[0], seed=1), _rand(*shapes[1], seed=2)
    out, vjp = jax.vjp(P.matmul, x, y)
    ref, ref_vjp = jax.vjp(lambda a, b: jnp.matmul(a, b, precision="highest"), x, y)
    _close(out, ref)
    cotangent = jnp.cos(ref)
    for g, w in zip(vjp(cotangent), ref_vjp(cotangent)):
        _close(g, w, 1e-4)


@pytest.mark.parametrize("shape,axis", [((5, 37), 1), ((3, 4, 6), 0), ((19,), 0)])
def test_softmax_kernel_forward_and_vjp(shape, axis):
    x = _rand(*shape)
    x = x.at[(0,) * x.ndim].set(40.0)  # a large logit: the max-shift must be right
    _close(P.softmax(x, axis), jax.nn.softmax(x, axis=axis))
    w = _rand(*shape, seed=5)
    got = jax.grad(lambda v: jnp.sum(P.softmax(v, axis) * w))(x)
    want = jax.grad(lambda v: jnp.sum(jax.nn.softmax(v, axis=axis) * w))(x)
    _close(got, want)


def test_softmax_kernel_masks_padding_and_keeps_nan_semantics():
    x = jnp.array([[1.0, 2.0, 3.0], [-jnp.inf, -jnp.inf, -jnp.inf], [0.0, -jnp.inf, 0.0]], jnp.float32)
    got = np.asarray(P.softmax(x, 1))
    want = np.asarray(torch.softmax(torch.tensor(np.asarray(x)), 1))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # NaN row stays NaN, like torch
    assert np.isnan(got[1]).all()


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape,n_axes", [((5, 37), 1), ((2, 3, 4, 5), 2)])
def test_norm_kernels_forward_and_vjp(shape, n_axes, rms):
    x = _rand(*shape) * 3 + 1
    normalized = shape[len(shape) - n_axes:]
    w, b = _rand(*normalized, seed=1), _rand(*normalized, seed=2)
    xt, wt, bt = (torch.tensor(np.asarray(v)) for v in (x, w, b))
    if rms:
        y, rstd = P.rms_norm(x, normalized, w, 1e-6)
        ref = F.rms_norm(xt, normalized, wt, 1e-6)
        _close(y, ref.numpy())
        dims = tuple(range(len(shape) - n_axes, len(shape)))
        _close(rstd, torch.rsqrt(xt.pow(2).mean(dims, keepdim=True) + 1e-6).numpy())
    else:
        y, mean, rstd = P.layer_norm(x, normalized, w, b, 1e-5)
        ref, ref_mean, ref_rstd = torch.native_layer_norm(xt, normalized, wt, bt, 1e-5)
        _close(y, ref.numpy())
        _close(mean, ref_mean.numpy())
        _close(rstd, ref_rstd.numpy())

    def loss(fn):
        return lambda xx, ww: jnp.sum(jnp.cos(fn(xx, ww)[0]))

    pallas = (lambda xx, ww: P.rms_norm(xx, normalized, ww, 1e-6)) if rms else \
        (lambda xx, ww: P.layer_norm(xx, normalized, ww, b, 1e-5))
    got = jax.grad(loss(pallas), (0, 1))(x, w)
    xt.requires_grad_(True), wt.requires_grad_(True)
    out = F.rms_norm(xt, normalized, wt, 1e-6) if rms else F.layer_norm(xt, normalized, wt, bt, 1e-5)
    torch.cos(out).sum().backward()
    _close(got[0], xt.grad.numpy(), 1e-4)
    _close(got[1], wt.grad.numpy(), 1e-4)


def _torch_attention(q, k, v, causal):
    return F.scaled_dot_product_attention(*(torch.tensor(np.asarray(t)) for t in (q, k, v)), is_causal=causal)


# Interpret mode is slow on CPU: two of the four shapes run with -m slow (the eager SDPA routing tests
# cover non-causal and lq != lk by default).
@pytest.mark.parametrize("causal,lq,lk,d", [slow(False, 19, 23, 8), (True, 19, 23, 8), (True, 33, 33, 12),
                                            slow(False, 5, 40, 16)])
def test_attention_kernel_forward_and_vjp(causal, lq, lk, d):
    q, k, v = _rand(2, 3, lq, d, seed=1), _rand(2, 3, lk, d, seed=2), _rand(2, 3, lk, d, seed=3)
    (out, lse), vjp = jax.vjp(lambda a, b, c: P.attention(a, b, c, causal, return_lse=True), q, k, v)
    _close(out, _torch_attention(q, k, v, causal).numpy())
    _, ref_lse = P._attention_mod.reference(q, k, v, causal, 1 / math.sqrt(d))
    _close(lse, ref_lse)
    cotangent = jnp.cos(out)  # d/d(out) of sum(sin(out))
    got = vjp((cotangent, jnp.zeros_like(lse)))
    tq, tk, tv = (torch.tensor(np.asarray(t), requires_grad=True) for t in (q, k, v))
    torch.sin(F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)).sum().backward()
    for g, t in zip(got, (tq, tk, tv)):
        _close(g, t.grad.numpy(), 1e-4)


def test_attention_kernel_explicit_scale():
    q, k, v = _rand(1, 2, 9, 4, seed=1), _rand(1, 2, 11, 4, seed=2), _rand(1, 2, 11, 4, seed=3)
    ref = F.scaled_dot_product_attention(*(torch.tensor(np.asarray(t)) for t in (q, k, v)), scale=0.3)
    _close(P.attention(q, k, v, False, 0.3), ref.numpy())


# ---------------------------------------------------------------- eager ops: pallas vs xla vs CPU
def _both_paths(fn, *cpu_inputs, atol=ATOL, grads=True):
    """Run fn on CPU, on tpu with the XLA path and with the Pallas path; compare values and grads."""
    def run(inputs):
        inputs = [t.detach().clone().requires_grad_(grads and t.is_floating_point()) for t in inputs]
        out = fn(*inputs)
        if grads:
            weights = torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.device)
            (out.float() * weights).sum().backward()
        return out.detach(), [t.grad for t in inputs if t.requires_grad]

    expected, expected_grads = run(cpu_inputs)
    for flag in (False, True):
        with tt.pallas(flag):
            out, out_grads = run(to_tpu(list(cpu_inputs)))
        assert_same(out, expected, 1e-5, atol)
        for g, e in zip(out_grads, expected_grads):
            assert_same(g, e, 1e-4, atol * 5)


@pytest.mark.parametrize("m,k,n", [(5, 7, 3), slow(33, 17, 40)])  # the larger shape: interpret mode is slow
def test_eager_mm_addmm_bmm_paths(m, k, n):
    a, b, bias = torch.randn(m, k), torch.randn(k, n), torch.randn(n)
    tstats.reset()
    _both_paths(torch.mm, a, b)
    _both_paths(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0), bias, a, b)
    _both_paths(torch.bmm, torch.randn(2, m, k), torch.randn(2, k, n))
    for op in ("aten::mm.default", "aten::addmm.default", "aten::bmm.default"):
        paths = _paths(op)
        assert paths.get("pallas", 0) >= 1 and paths.get("xla", 0) >= 1, (op, paths)


def test_eager_mm_integer_takes_xla_path():
    a, b = torch.randint(-5, 5, (4, 3)), torch.randint(-5, 5, (3, 2))
    tstats.reset()
    with tt.pallas(True):
        assert_same(torch.mm(a.to(TPU), b.to(TPU)), a @ b)
    assert _paths("aten::mm.default") == {"xla": 1}  # integers: not covered, so never counted as pallas


@pytest.mark.parametrize("shape,dim", [((6, 37), -1), ((3, 5, 4), 1)])
def test_eager_softmax_paths(shape, dim):
    tstats.reset()
    _both_paths(lambda x: torch.softmax(x, dim), torch.randn(*shape))
    paths = _paths("aten::_softmax.default")
    assert paths.get("pallas") == 1 and paths.get("xla") == 1


def test_eager_softmax_half_to_float():
    x = torch.randn(4, 9).to(torch.bfloat16)
    with tt.pallas(True):
        out = torch.softmax(x.to(TPU), -1, dtype=torch.float32)
    assert_same(out, torch.softmax(x, -1, dtype=torch.float32), tol="ulps")


@pytest.mark.parametrize("shape,normalized", [((5, 37), (37,)), ((2, 3, 4, 5), (4, 5))])
def test_eager_layer_norm_paths(shape, normalized):
    tstats.reset()
    w, b = torch.randn(normalized), torch.randn(normalized)
    _both_paths(lambda x, w, b: F.layer_norm(x, normalized, w, b), torch.randn(*shape) * 2 + 1, w, b)
    paths = _paths("aten::native_layer_norm.default")
    assert paths.get("pallas") == 1 and paths.get("xla") == 1


def _math_calls() -> int:  # the math op's kernel ("...math.default") and autograd Function ("...math")
    return sum(n for op, n in tt.stats()["op_counts"].items() if op.startswith("aten::_scaled_dot_product_attention_math")
               and "backward" not in op)


_FUSED_SDPA = "aten::_scaled_dot_product_fused_attention_overrideable.default"
_FUSED_SDPA_BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward.default"


@pytest.mark.parametrize("causal,lq,lk,d", [(False, 37, 37, 24), (True, 37, 37, 24), (True, 9, 21, 8),
                                         (False, 50, 13, 40)])
def test_eager_sdpa_routes_to_flash_kernel(causal, lq, lk, d):
    q, k, v = torch.randn(2, 3, lq, d), torch.randn(2, 3, lk, d), torch.randn(2, 3, lk, d)
    tstats.reset()
    _both_paths(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v)
    # torch's composite asks our kernel choice (C++): the fused op, forward and backward, on either path
    assert _paths(_FUSED_SDPA) == {"pallas": 1, "xla": 1}
    assert _paths(_FUSED_SDPA_BACKWARD) == {"pallas": 1, "xla": 1}
    assert "aten::_scaled_dot_product_attention_math" not in tt.stats()["op_counts"]


def test_eager_sdpa_flash_kernel_bfloat16_and_scale():
    q, k, v = (torch.randn(1, 2, 19, 16).to(torch.bfloat16) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    with tt.pallas(True):
        out = F.scaled_dot_product_attention(*to_tpu([q, k, v]), scale=0.3)
    assert_same(out, expected, 2e-2, 2e-2)
    assert _paths(_FUSED_SDPA).get("pallas", 0) >= 1


def test_eager_sdpa_uncovered_arguments_take_xla_path_and_errors_match_cpu():
    q, k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    tstats.reset()
    math_calls = _math_calls()
    with tt.pallas(True):
        out = F.scaled_dot_product_attention(*to_tpu([q, k, v]), attn_mask=mask.to(TPU))
        assert_same(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        gqa = F.scaled_dot_product_attention(to_tpu(q), to_tpu(k[:, :1]), to_tpu(v[:, :1]), enable_gqa=True)
        assert_same(gqa, F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True))
        with pytest.raises(RuntimeError) as cpu_error:
            F.scaled_dot_product_attention(q, k, v.to(torch.float64))
        with pytest.raises(RuntimeError, match=r"Expected query, key, and value to have the same dtype"):
            F.scaled_dot_product_attention(*to_tpu([q, k, v.to(torch.float64)]))
        assert "same dtype" in str(cpu_error.value)
    assert _paths(_FUSED_SDPA) == {"xla": 1}  # the mask: the fused op's XLA lowering
    # GQA with fewer k/v heads: the math op (the fused op has no enable_gqa)
    assert _math_calls() == math_calls + 1


def test_compiled_graph_uses_pallas_kernels():
    def fn(x, w):
        return torch.softmax(F.layer_norm(x @ w, (6,)), -1)

    x, w = torch.randn(5, 4), torch.randn(4, 6)
    tstats.reset()
    with tt.pallas(True):
        out = tt.compile(fn)(to_tpu(x), to_tpu(w))
    assert_same(out, fn(x, w), tol="ulps")
    kp = tt.stats()["kernel_paths"]
    for op in ("aten::mm.default", "aten::native_layer_norm.default", "aten::_softmax.default"):
        assert kp.get(op, {}).get("pallas", 0) >= 1, (op, kp)
    torch._dynamo.reset()


def test_platform_and_attached_ops():
    assert P.platform() == jax.default_backend().replace("cuda", "gpu")
    for op in ("mm.default", "bmm.default", "addmm.default", "_softmax.default", "native_layer_norm.default"):
        assert op in P.ATTACHED
    assert _FUSED_SDPA.removeprefix("aten::") in P.ATTACHED and _FUSED_SDPA_BACKWARD.removeprefix("aten::") in P.ATTACHED
    # torch's composite runs (it asks the C++ extension's kernel choice); no kernel of ours replaces it
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::scaled_dot_product_attention", "AutogradPrivateUse1")
    assert tt.pallas() is False  # the switch (config.pallas), not the kernels package
    with tt.pallas(True):
        assert tt.pallas() is True
    assert tt.pallas() is False


# ---------------------------------------------------------------- the TPU (Mosaic) path, lowered on CPU
def _tpu_kernel_calls():
    """(name, fn, args) for every kernel's TPU path: ours, and the jax library kernels we call there."""
    x, y = _rand(200, 130, seed=1), _rand(130, 70, seed=2)
    q, k, v = _rand(1, 2, 20, 8, seed=1), _rand(1, 2, 24, 8, seed=2), _rand(1, 2, 24, 8, seed=3)
    w, b = _rand(70, seed=4), _rand(70, seed=5)
    scalar = lambda f: (lambda *a: jnp.sum(jnp.sin(f(*a))))  # noqa: E731  (a gradient through the kernel)
    return [
        ("matmul", jax.grad(scalar(P.matmul), (0, 1)), (x, y)),
        ("bmm", jax.grad(scalar(P.matmul), (0, 1)), (_rand(3, 20, 30, seed=1), _rand(3, 30, 10, seed=2))),
        ("softmax", jax.grad(scalar(lambda a: P.softmax(a, -1))), (x,)),
        ("layer_norm", jax.grad(scalar(lambda a, c, d: P.layer_norm(a, (70,), c, d)[0]), (0, 1, 2)),
         (_rand(9, 70, seed=3), w, b)),
        ("flash attention", jax.grad(scalar(lambda a, c, d: P.attention(a, c, d, True)), (0, 1, 2)), (q, k, v)),
    ]


def test_tpu_kernels_lower_for_mosaic_with_x64_on_and_full_precision(monkeypatch):
    """Every kernel's TPU path (forward and backward) lowers for the TPU platform here on CPU, and each
    pallas_call, ours or the jax library's, is traced with 64-bit types off and at HIGHEST matmul
    precision. A TPU v5e run found both: with x64 on (the backend's setting) Mosaic refused our softmax
    ('func.return ... (i32, i64)') and aborted the process in flash attention, and the library matmul's
    default one-pass bf16 product was 0.55 off the float32 result."""
    from jax.experimental import pallas as pl
    from tpu_interactive.backend.kernels import _common

    assert jax.config.jax_enable_x64  # the backend's setting, the one that broke Mosaic
    traced = []
    real_pallas_call = pl.pallas_call

    def recording_pallas_call(*args, **kwargs):
        traced.append((kwargs.get("name"), bool(jax.config.jax_enable_x64), jax.config.jax_default_matmul_precision))
        return real_pallas_call(*args, **kwargs)

    monkeypatch.setattr(pl, "pallas_call", recording_pallas_call)
    for module in (_common, P._attention_mod, P._matmul_mod, P._norms_mod, P._softmax_mod):
        monkeypatch.setattr(module, "platform", lambda: "tpu")
    if not hasattr(jax, "enable_x64"):  # jax < 0.7 cannot trace them so: the Pallas switch takes XLA there
        assert not P.available()
        return
    jax.clear_caches()  # the kernels are jitted: no trace from the CPU tests may be reused
    try:
        for name, fn, args in _tpu_kernel_calls():
            traced.clear()
            hlo = jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
            assert "tpu_custom_call" in hlo, name  # a Mosaic kernel, not interpret mode
            assert traced, name
            for kernel, x64, precision in traced:
                assert not x64, (name, kernel)
            if name in ("matmul", "bmm"):  # our K-blocked kernel at HIGHEST, not the library's bf16 pass
                assert any(kernel == "tpu_interactive_matmul_tpu" for kernel, _, _ in traced), traced
            if name == "flash attention":  # the library kernel's dots take the default precision
                assert all(precision == "highest" for _, _, precision in traced), traced
    finally:
        jax.clear_caches()


@pytest.mark.parametrize("shapes", [((100, 130), (130, 70)), ((2, 40, 1100), (2, 1100, 20))])
def test_tpu_matmul_kernel_in_interpret_mode(shapes):
    """The TPU grid kernel's arithmetic (K-blocked float32 accumulator, ragged padding, batch), run by
    the Pallas interpreter: float32 at full precision, bfloat16 rounded once from the float32 sum."""
    x, y = _rand(*shapes[0], seed=1), _rand(*shapes[1], seed=2)
    _close(P._matmul_mod._tpu_mm(x, y, interpret=True), jnp.matmul(x, y, precision="highest"), 1e-4)
    xb, yb = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
    out = P._matmul_mod._tpu_mm(xb, yb, interpret=True)
    assert out.dtype == jnp.bfloat16
    ref = jnp.matmul(xb, yb, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    # within one bfloat16 ulp (2**-7 of the value at most): the K-blocked float32 sum and XLA's
    # (another order) can round to neighbouring bfloat16 values (1 of 1600 elements on a TPU v5e and
    # on an AVX-512/AMX XLA:CPU host, where -0.3945 vs -0.3965 is one ulp, 0.49% of the value)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)),
                               rtol=2.0**-7, atol=0)
