"""scaled_dot_product_attention (ops/attention.py) vs CPU PyTorch: masks, causal, GQA, dropout, grads."""
import pytest
import torch
import torch.nn.functional as F
from packaging.version import Version

from helpers import TPU, assert_same, check, grad_check, rand

from tpu_interactive.backend.registry import TORCH_VERSION

pytestmark = pytest.mark.usefixtures("no_fallback")


# ---------------------------------------------------------------- scaled_dot_product_attention
def sdpa_check(q, k, v, mask_grad=False, **kwargs):
    """F.scaled_dot_product_attention output and q/k/v (and float mask) grads match CPU."""
    mask = kwargs.pop("attn_mask", None)
    if mask_grad:
        grad_check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs), q, k, v, mask)
        return

    def fn(q, k, v):
        m = None if mask is None else mask.to(q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **kwargs)

    grad_check(fn, q, k, v)


def qkv(b=2, h=3, lq=5, lk=7, e=8, ev=6, hk=None, seed=0, dtype=torch.float32):
    hk = h if hk is None else hk
    return (rand(b, h, lq, e, seed=seed, dtype=dtype), rand(b, hk, lk, e, seed=seed + 1, dtype=dtype),
            rand(b, hk, lk, ev, seed=seed + 2, dtype=dtype))


def test_sdpa_no_mask_and_scale():
    import tpu_interactive
    fused = "aten::_scaled_dot_product_fused_attention_overrideable.default"
    before = tpu_interactive.stats()["op_counts"].get(fused, 0)
    sdpa_check(*qkv())
    sdpa_check(*qkv(), scale=0.3)
    sdpa_check(*qkv(), scale=-0.5)
    # torch's composite asks the C++ extension's kernel choice: 4-d q/k/v take the fused op
    assert tpu_interactive.stats()["op_counts"][fused] >= before + 3


@pytest.mark.parametrize("through", ["output", "weights", "both"])
def test_sdpa_math_gradients_through_either_output_match_cpu(through):
    """An output nobody differentiates gets no gradient tensor (None, zeros made in the program): the
    attention weights F.scaled_dot_product_attention drops, or the output where only the weights are
    used; the gradients equal CPU's either way."""
    import tpu_interactive

    def fn(q, k, v):
        out, weights = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=None)
        return {"output": out.sum() * 1.5, "weights": (weights * weights).sum(),
                "both": out.sum() + (weights * 2).sum()}[through]

    before = tpu_interactive.stats()["op_counts"]
    grad_check(fn, *qkv())
    after = tpu_interactive.stats()["op_counts"]
    # the missing gradient was an empty + zero_ (a [batch, heads, L, S] tensor) per backward
    if through == "output":
        assert after.get("aten::zero_", 0) == before.get("aten::zero_", 0)


def test_sdpa_bool_mask_broadcast():
    mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[..., 0] = True
    sdpa_check(*qkv(), attn_mask=mask)
    sdpa_check(*qkv(), attn_mask=mask[0, 0])


def test_sdpa_float_mask_with_grad():
    sdpa_check(*qkv(), attn_mask=rand(5, 7, seed=4), mask_grad=True)
    sdpa_check(*qkv(), attn_mask=rand(2, 3, 5, 7, seed=4), mask_grad=True)


def test_sdpa_fully_masked_row_gives_zeros_like_cpu():
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    q, k, v = qkv()
    actual = F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), attn_mask=mask.to(TPU))
    assert_same(actual, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert (actual.cpu()[:, :, 2] == 0).all()


def test_sdpa_fully_masked_row_gradients_are_zero_not_nan():
    # left padding in batched generation makes such rows; CPU's gradient there is 0
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    sdpa_check(*qkv(), attn_mask=mask)


@pytest.mark.parametrize("lq,lk", [(5, 5), (4, 7), (7, 4)])
def test_sdpa_causal(lq, lk):
    sdpa_check(*qkv(lq=lq, lk=lk), is_causal=True)


def test_sdpa_gqa_and_3d():
    sdpa_check(*qkv(h=4, hk=2), enable_gqa=True)
    sdpa_check(*qkv(h=6, hk=2), enable_gqa=True, is_causal=True)
    q, k, v = qkv()
    sdpa_check(q[0], k[0], v[0])


def test_sdpa_transposed_inputs():
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv())  # non-contiguous strides
    assert not q.is_contiguous()
    sdpa_check(q, k, v, is_causal=True)


def test_sdpa_bfloat16_computed_in_float32():
    sdpa_check(*qkv(dtype=torch.bfloat16))  # the "ulps" tolerance: bfloat16's 2e-2
    sdpa_check(*qkv(dtype=torch.bfloat16), attn_mask=rand(5, 7, dtype=torch.bfloat16))


def test_sdpa_dropout_mask_scaling_and_grad():
    q, k, v = (t.to(TPU).requires_grad_() for t in qkv(b=2, h=2, lq=16, lk=32))
    torch.manual_seed(0)
    out, attn = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, dropout_p=0.25)
    _, plain = torch.ops.aten._scaled_dot_product_attention_math(q.detach().cpu(), k.detach().cpu(),
                                                                 v.detach().cpu())
    attn_cpu = attn.detach().cpu()
    kept = attn_cpu != 0
    assert 0.6 < kept.float().mean().item() < 0.9  # keep prob 0.75
    torch.testing.assert_close(attn_cpu[kept], (plain / 0.75)[kept], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.detach().cpu(), attn_cpu @ v.detach().cpu(), rtol=1e-5, atol=1e-5)
    g = rand(*out.shape, seed=9)
    out.backward(g.to(TPU))
    torch.testing.assert_close(v.grad.cpu(), attn_cpu.transpose(-1, -2) @ g, rtol=1e-5, atol=1e-5)
    # same seed, same mask; the functional API applies dropout too
    torch.manual_seed(0)
    again, _ = torch.ops.aten._scaled_dot_product_attention_math(q.detach(), k.detach(), v.detach(), dropout_p=0.25)
    assert_same(again, out.detach().cpu())
    y = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), dropout_p=0.5)
    z = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert not torch.allclose(y.cpu(), z.cpu())


def test_sdpa_explicit_dropout_mask_matches_cpu():
    q, k, v = qkv()
    keep = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(5)) > 0.3

    def fn(q, k, v):
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.3, False, keep_of(q))

    def keep_of(q):
        return keep.to(q.device)

    expected = fn(q, k, v)
    actual = fn(q.to(TPU), k.to(TPU), v.to(TPU))
    assert_same(actual, expected)
    grad_check(lambda q, k, v: fn(q, k, v)[0], q, k, v)


@pytest.mark.parametrize("dropout_mask", [False, True])
def test_sdpa_of_views_in_fused_mode_reads_them_in_its_own_step(dropout_mask):
    """q, k, v as MultiheadAttention makes them (views of one projection): the recorded attention step
    reads the views itself, forward and backward (no read step per view), and equals CPU, grads too."""
    import tpu_interactive
    from tpu_interactive.backend import fusion

    base = rand(2, 5, 3, 4, 8, seed=3)  # (batch, seq, q/k/v, heads, dim)
    keep = torch.rand(2, 4, 5, 5, generator=torch.Generator().manual_seed(1)) > 0.25

    def attention(packed, mask):
        q, k, v = (t.transpose(1, 2) for t in packed.unbind(2))
        if not dropout_mask:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, None, 0.25, False, mask)[0]

    cpu = base.clone().requires_grad_()
    want = attention(cpu, keep)
    want.backward(torch.ones_like(want))
    ours = base.to(TPU).requires_grad_()
    with tpu_interactive.fuse():
        fusion.flush()
        got = attention(ours, keep.to(TPU))
        names = [step[3] for step in fusion.current().steps]
        got.backward(torch.ones_like(got))
        backward = [step[3] for step in fusion.current().steps]
    assert "tensor read/write" not in names, names
    vjp = [i for i, name in enumerate(backward) if "vjp" in name or "attention" in name]  # math op / fused op
    assert len(vjp) == 1 and backward[vjp[0] - 1] != "tensor read/write", backward  # no reads of q, k, v before it
    assert_same(got, want)
    assert_same(ours.grad, cpu.grad)


def test_sdpa_errors_like_cpu():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q.to(TPU), k.to(TPU).double(), v.to(TPU))
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q.to(TPU), k.to(TPU), v.to(TPU), attn_mask=torch.ones(5, 7, device=TPU),
                                       is_causal=True)


def test_sdpa_inference_mode():
    q, k, v = qkv()
    with torch.inference_mode():
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)


# ---------------------------------------------------------------- which kernel torch's composite takes
FUSED = "aten::_scaled_dot_product_fused_attention_overrideable.default"
MATH = "aten::_scaled_dot_product_attention_math"
native_only = pytest.mark.skipif(not __import__("tpu_interactive.backend.native", fromlist=["x"]).available(),
                                 reason="the kernel choice is the C++ extension's (built on import with g++)")


def _calls(op: str) -> int:
    """Calls of ``op`` so far: its kernel counts as "op.default", its autograd Function as "op"."""
    import tpu_interactive

    return sum(n for name, n in tpu_interactive.stats()["op_counts"].items() if name.split(".")[0] == op.split(".")[0]
               and "backward" not in name)


def _float_mask(b, h, lq, lk, seed=4):
    return rand(b, h, lq, lk, seed=seed)


CHOICES = {  # name: (call on q, k, v, the op it reaches)
    "plain": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), FUSED),
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), FUSED),
    "float mask [L, S]": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_float_mask(1, 1, 5, 7)[0, 0]
                                                                       .to(q.device)), FUSED),
    "key padding bool mask": (lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=(torch.arange(7) < 5).view(1, 1, 1, 7).to(q.device)), FUSED),
    "scale": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.2), FUSED),
    "GQA": (lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True), MATH),
    "heads broadcast": (lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1]), MATH),
    # torch 2.14's composite asks with 3-d q/k/v made 4-d (a batch of one); 2.13's asks with them as they are
    "3-d": (lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0]),
            FUSED if TORCH_VERSION >= Version("2.14") else MATH),
    "mask that does not fit [L, L]": (lambda q, k, v: F.scaled_dot_product_attention(
        q[..., :5, :], k[..., :5, :], v[..., :5, :], attn_mask=_float_mask(2, 3, 5, 5).to(q.device)), FUSED),
    # torch's composite answers empty keys itself (zeros), before asking for a kernel
    "empty keys": (lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :, :0], v[:, :, :0]), None),
}


@native_only
@pytest.mark.parametrize("name", CHOICES)
def test_sdpa_kernel_choice_and_values_match_cpu(name):
    """torch's composite F.scaled_dot_product_attention asks the device's kernel choice (C++): the fused
    op (one lowered op with torch's own autograd formula) where it covers the call, the math op else;
    values and gradients equal CPU's either way."""  # (old code: every call was the math op)
    fn, op = CHOICES[name]
    before = {o: _calls(o) for o in (FUSED, MATH)}
    if name == "empty keys":
        check(fn, *qkv())  # CPU's NaN rows / empty grads: forward only
    else:
        grad_check(fn, *qkv())
    ran = {o for o in (FUSED, MATH) if _calls(o) > before[o]}
    assert ran == ({op} if op else set()), (name, ran)


@native_only
def test_sdpa_backend_switches_and_dropout_take_the_math_op_or_cpus_error():
    """sdpa_kernel(MATH) keeps the math op; dropout is the math op's (the fused op draws no mask); with
    only the fused kernels allowed, dropout gets CPU's own error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.to(TPU) for t in qkv())
    before = _calls(MATH)
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(q, k, v)
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    assert _calls(MATH) == before + 2
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fused = _calls(FUSED)
        F.scaled_dot_product_attention(q, k, v)
        assert _calls(FUSED) == fused + 1
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(*qkv(), dropout_p=0.3)  # CPU's refusal, for the words
        with pytest.raises(RuntimeError, match="No available kernel"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)


def test_fused_op_called_directly_returns_torchs_nine_results():
    """aten::_scaled_dot_product_fused_attention_overrideable's results: the output, the float32
    logsumexp of each query's scores, undefined tensors, max_q / max_k, and 0-d seed / offset."""
    q, k, v = qkv()
    mask = _float_mask(1, 3, 5, 7)
    got = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q.to(TPU), k.to(TPU), v.to(TPU),
                                                                         mask.to(TPU), scale=0.4)
    scores = (q @ k.transpose(-1, -2)) * 0.4 + mask
    assert_same(got[0], torch.softmax(scores, -1) @ v, tol="ulps")
    assert_same(got[1], torch.logsumexp(scores, -1), tol="ulps")
    assert (got[4], got[5]) == (5, 7)
    assert got[6].shape == got[7].shape == () and got[6].dtype == torch.int64
    with pytest.raises(NotImplementedError, match="dropout"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q.to(TPU), k.to(TPU), v.to(TPU), dropout_p=0.1)


@native_only
def test_sdpa_in_fused_mode_records_from_plans_and_equals_cpu():
    """Fused mode: the attention's forward and backward are recorded from C++ record plans on a repeat
    (no Python dispatch), and the step equals CPU's."""
    import tpu_interactive
    from tpu_interactive.backend import fast_path, fusion

    q, k, v = qkv()
    mask = _float_mask(2, 1, 5, 7)

    def step(q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device), is_causal=False)
        (out * out).sum().backward()
        return out.detach()

    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    want = step(*cpu)
    dev = [t.to(TPU).requires_grad_() for t in (q, k, v)]
    with tpu_interactive.fuse():
        for _ in range(3):
            for t in dev:
                t.grad = None
            fusion.flush()
            before = fast_path.recorded()
            got = step(*dev)
            names = [s[3] for s in fusion.current().steps]
            recorded = fast_path.recorded() - before
    assert "aten::_scaled_dot_product_fused_attention_overrideable_backward.default" in names
    assert recorded >= 4, (recorded, names)  # forward, mul, sum's backward chain, the attention backward
    assert_same(got, want, tol="ulps")
    assert_same([t.grad for t in dev], [t.grad for t in cpu], tol="ulps")
