"""Views alias their base and in-place ops mutate shared memory exactly as on CPU.

Each scenario runs the same function on a CPU tensor and on a tpu copy and compares every tensor
it returns (the base and its views after the mutations), so aliasing bugs show up as value diffs.
"""
import pytest
import torch

from helpers import TPU, assert_same

import tpu_interactive as tt

pytestmark = pytest.mark.usefixtures("no_fallback")


def base(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape).to(dtype).clone()


def same_on_both(fn, *inputs):
    """fn mutates its (cloned) inputs and returns tensors; CPU and tpu must agree on all of them."""
    cpu = fn(*[x.clone() for x in inputs])
    tpu = fn(*[x.to(TPU) for x in inputs])
    assert_same(tpu, cpu)


# ---------------------------------------------------------------- writes through views update the base
SCENARIOS = {
    "setitem_column": lambda x: (x.__setitem__((slice(None), 0), 5), x)[1:],
    "setitem_step_slice": lambda x: (x.__setitem__((slice(None, None, 2), slice(1, None, 3)), -1), x)[1:],
    "setitem_negative": lambda x: (x.__setitem__((-1, slice(-3, None)), 9), x)[1:],
    "flat_view_add_": lambda x: (x.view(-1).add_(1), x)[1:],
    "t_copy_": lambda x: (x.t().copy_(torch.arange(30.0).reshape(6, 5).to(x.device)), x)[1:],
    "select_mul_": lambda x: (x.select(1, 2).mul_(10), x)[1:],
    "transpose_fill_": lambda x: (x.transpose(0, 1)[1].fill_(3), x)[1:],
    "narrow_zero_": lambda x: (x.narrow(1, 2, 3).zero_(), x)[1:],
    "diagonal_add_": lambda x: (x.diagonal().add_(100), x.diagonal(1).sub_(1), x)[2:],
    "unfold_copy_": lambda x: (x.unfold(1, 2, 2).select(2, 0).fill_(-7), x)[1:],
    "split_chunk_unbind": lambda x: (x.split(2)[1].add_(1), x.chunk(3, 1)[2].mul_(2), x.unbind(0)[4].neg_(), x)[3:],
    "unsqueeze_squeeze": lambda x: (x.unsqueeze(0).squeeze(0)[2].add_(5), x[None, :, None].squeeze()[0].zero_(), x)[2:],
    "permute_3d": lambda x: (x.view(5, 3, 2).permute(2, 0, 1)[1].add_(1), x)[1:],
    "view_of_view": lambda x: (x.view(30)[5:20].view(3, 5)[1:, ::2].mul_(-1), x)[1:],
    "reshape_view_alias": lambda x: (x.reshape(3, 10)[2].fill_(0), x)[1:],
    "masked_fill_": lambda x: (x.masked_fill_(x > 10, 0), x)[1:],
    "masked_fill_view": lambda x: (x[1:4].masked_fill_(x[1:4] < 15, -1), x)[1:],
    "mask_setitem": lambda x: (x.__setitem__(x % 3 == 0, 0.5), x)[1:],
    "index_put_": lambda x: (x.index_put_((torch.tensor([0, 4], device=x.device),), torch.tensor(2.0, device=x.device)), x)[1:],
    "index_put_view": lambda x: (x.t().index_put_((torch.tensor([1, 5], device=x.device),), torch.ones(5, device=x.device), accumulate=True), x)[1:],
    "index_add_view": lambda x: (x[:, 1:].index_add_(1, torch.tensor([0, 0], device=x.device), torch.ones(5, 2, device=x.device)), x)[1:],
    "scatter_view": lambda x: (x.t()[::2].scatter_(1, torch.tensor([[0], [4], [2]], device=x.device), -3.0), x)[1:],
    "copy_broadcast": lambda x: (x[1:3].copy_(torch.arange(6.0).to(x.device)), x)[1:],
    "expand_source": lambda x: (x.copy_(x[0].expand(5, 6).clone()), x)[1:],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_write_through_view_updates_base(name):
    same_on_both(SCENARIOS[name], base(5, 6))


def test_views_see_base_writes_and_each_other():
    def fn(x):
        row, col, flat, diag = x[1], x[:, 2], x.view(-1), x.diagonal()
        x.add_(1)           # base -> views
        row.mul_(2)         # view -> base and overlapping views
        flat[7] = -5        # flat view -> 2-d views
        return x, row, col, flat, diag
    same_on_both(fn, base(4, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_view_writes_for_dtypes(dtype):
    def fn(x):
        x[:, 1] = x[:, 0]
        x.t()[2:, 1:3] = x[0, 0]
        return (x,)
    same_on_both(fn, (base(4, 5) % 3).to(dtype))


def test_slicing_views_read_like_cpu():
    x = base(4, 5, 6)
    xt = x.to(TPU)
    views = [
        lambda t: t[::2, 1::2, ::3], lambda t: t[-1], lambda t: t[..., -2], lambda t: t[:, -3:-1],
        lambda t: t.transpose(0, 2), lambda t: t.permute(1, 2, 0)[::2], lambda t: t[0].t()[1:, ::2],
        lambda t: t[1].expand(3, 5, 6), lambda t: t[:, :1].expand(4, 7, 6), lambda t: t.unfold(2, 3, 2),
        lambda t: t.diagonal(0, 1, 2), lambda t: t.narrow(-1, 1, 4).unsqueeze(1), lambda t: t[None, 2, None],
        lambda t: t.movedim(0, -1)[..., 1:3], lambda t: t.as_strided((3, 3), (7, 2), 5),
        lambda t: t.view(20, 6)[3::5], lambda t: t.flatten(1)[:, 7:29:7],
    ]
    for view in views:
        assert_same(view(xt), view(x))
        assert view(xt).stride() == view(x).stride()
        assert view(xt).storage_offset() == view(x).storage_offset()


def test_base_is_view_data_ptr_like_cpu():
    for device in ("cpu", TPU):
        x = base(4, 6).to(device)
        v = x[1:, ::2]
        vv = v.t()
        assert v._base is x and vv._base is x and v._is_view() and not x._is_view()
        assert x._base is None
        assert v.data_ptr() == x.data_ptr() + x.stride(0) * x.element_size()
        assert vv.data_ptr() == v.data_ptr()
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert x.detach().data_ptr() == x.data_ptr()
        assert x.clone().data_ptr() != x.data_ptr()
        assert x.reshape(24)._base is x and x.t().reshape(24)._base is None  # copy when not viewable
        y = base(4, 6).to(device)
        assert y.data_ptr() != x.data_ptr()
        assert x.t().contiguous()._base is None and x.contiguous() is x


def test_contiguous_and_reshape_copy_are_independent():
    def fn(x):
        c = x.t().contiguous()
        r = x.t().reshape(-1)  # needs a copy
        c.add_(1000)
        r.mul_(-1)
        return x, c, r
    same_on_both(fn, base(3, 4))


def test_view_dtype_bitcast():
    x = torch.randn(3, 4)
    xt = x.to(TPU)
    assert_same(xt.view(torch.int32), x.view(torch.int32))
    assert_same(xt.t().view(torch.int32), x.t().view(torch.int32))
    assert_same(xt.view(torch.int32).view(torch.float32), x)
    i = xt.view(torch.int32)
    assert (i._base is xt) == (x.view(torch.int32)._base is x)  # (False on CPU too: not differentiable)
    assert i.data_ptr() == xt.data_ptr() and i.untyped_storage().data_ptr() == xt.untyped_storage().data_ptr()
    i[0, 0] = 0                             # writes through the bitcast view reach the float tensor
    assert xt[0, 0].item() == 0.0
    b = torch.randn(5).bfloat16()
    assert_same(b.to(TPU).view(torch.int16), b.view(torch.int16))
    with pytest.raises(NotImplementedError, match="element size"):
        xt.view(torch.int8)


# ---------------------------------------------------------------- errors like CPU
def test_inplace_on_expanded_raises_like_cpu():
    for device in ("cpu", TPU):
        e = torch.zeros(3, device=device).expand(4, 3)
        with pytest.raises(RuntimeError, match="single memory location"):
            e.add_(1)
        with pytest.raises(RuntimeError, match="single memory location"):
            e.copy_(torch.ones(4, 3, device=device))


def test_version_counter_errors_like_cpu():
    for device in ("cpu", TPU):
        a = torch.randn(3, device=device, requires_grad=True)
        b = a.exp()
        v0 = b._version
        b.add_(1)
        assert b._version == v0 + 1
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            b.sum().backward()
        # through a view: the view's in-place bumps the base's counter
        c = a.sigmoid()
        w = c[1:]
        w.mul_(2)
        assert c._version == w._version and c._version > 0
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            c.sum().backward()


def test_leaf_view_inplace_errors_like_cpu():
    for device in ("cpu", TPU):
        a = torch.randn(3, device=device, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            a[0].add_(1)


def test_autograd_through_inplace_on_views():
    def run(device):
        a = torch.arange(6.0, device=device).reshape(2, 3).requires_grad_()
        b = a * 1.0
        b[:, 1] = b[:, 0] * 3       # copy_ into a view of a non-leaf (CopySlices)
        b.t()[0].mul_(2)
        b.view(-1)[4:].add_(b[0, :2])
        (b * torch.arange(6.0, device=device).reshape(2, 3)).sum().backward()
        return b.detach(), a.grad
    cpu, tpu = run("cpu"), run(TPU)
    assert_same(tpu, cpu)


def test_storage_write_patterns():
    """storage.write through many stride patterns (dense fast path and gather path)."""
    def fn(x):
        x[1::2, ::3, 1] = -1                                 # gather path
        x.permute(2, 0, 1)[0, 1:3] = 7                       # permuted block
        x.view(4, 30)[:, 5:10] = 2                           # strided rows
        x.as_strided((2, 2), (31, 1), 3).fill_(9)            # arbitrary geometry
        x[3].t()[1].zero_()
        return (x,)
    same_on_both(fn, base(4, 6, 5))


@pytest.mark.eager_only  # fused mode records these writes into its segment's program instead
def test_writes_into_part_of_a_buffer_update_it_in_place_and_never_a_sharer(monkeypatch):
    """A write into a slice of a buffer donates the buffer's array to its program (XLA then updates it
    in place: the slice's cost, not a copy of the buffer) only when nothing else holds that array."""
    from tpu_interactive.backend import fast_path, storage

    # donation decided at the write: with compile ahead, a write of a deferred array decides it when
    # it runs (test_compile_ahead.py covers that), and on a TPU host the arrays here are still deferred
    monkeypatch.setattr(tt.config, "compile_ahead", False)
    chosen = []
    run = storage._run

    def counted(program, inputs, donate=0, intent=0):
        if len(inputs) == 2:  # a write into part of a buffer: (the buffer's array, the value)
            chosen.append(bool(donate))
        return run(program, inputs, donate, intent)

    monkeypatch.setattr(storage, "_run", counted)
    cpu = torch.arange(4096.0)
    x = cpu.to(TPU)
    shared = x.clone()  # may share x's array (arrays are immutable) until one of them is written
    src = torch.randn(64)
    donations = fast_path.donations()
    for i in range(4):
        for t in (cpu, x):
            t[100:164].copy_(src.to(t.device) * i)  # copy_: storage.write
            t[1000:1064].mul_(2.0)  # an in-place op's plan (C++ on repeated calls)
            t[7:9] += 1
    assert_same(x, cpu)
    assert_same(shared, torch.arange(4096.0))  # the clone never saw x's writes
    held = storage.buffer_of(x).array  # a reference the buffer does not own (a cache, a jax caller)
    for t in (cpu, x):
        t[100:164].copy_(src.to(t.device))
        t[1000:1064].mul_(2.0)
    assert not held.is_deleted()
    assert_same(x, cpu)
    assert True in chosen and False in chosen  # the first write shared x's array with the clone: no donation
    if fast_path._native is not None:
        assert fast_path.donations() > donations


@pytest.mark.eager_only  # fused mode makes a never-written buffer's zeros inside the segment
def test_repeated_large_zeros_come_from_one_device_program():
    """Zeros over 64 KiB of a shape made before (a loop's per-step buffers) come from the shape's
    device program, not a host fill and a transfer each time; the first ones are copied from the
    host (no compile for one-off state). Values are zeros either way, and writing one never
    reaches the next."""
    from tpu_interactive.backend import fills

    shape = (129, 257)  # 130 KiB of float32, a shape no other test makes
    programs = fills._zeros_program.cache_info().currsize
    first = torch.empty(shape, device="tpu")
    first.add_(1)  # reads the never-written buffer: zeros
    assert fills._zeros_program.cache_info().currsize == programs  # the first: copied from the host
    second = torch.empty(shape, device="tpu")
    second.mul_(3)
    assert fills._zeros_program.cache_info().currsize == programs + 1
    third = torch.empty(shape, device="tpu").sub_(2)
    assert fills._zeros_program.cache_info().currsize == programs + 1  # the same program again
    assert torch.equal(first.cpu(), torch.ones(shape)) and torch.equal(second.cpu(), torch.zeros(shape))
    assert torch.equal(third.cpu(), torch.full(shape, -2.0))


def test_small_fills_share_one_host_made_array_and_writes_never_leak():
    """``torch.ones``/``zeros``/``full`` of a small never-written tensor share one device array per
    shape, dtype and value (made once on the host): in-place writes to one never reach another,
    and values that compare equal but differ in bits (-0.0, 0.0) are kept apart."""
    from tpu_interactive.backend import storage

    a, b = torch.ones(3, 5, device="tpu"), torch.ones(3, 5, device="tpu")
    z, nz = torch.full((4,), 0.0, device="tpu"), torch.full((4,), -0.0, device="tpu")
    assert storage.buffer_of(a).array is storage.buffer_of(b).array  # in fused mode too: nothing recorded
    a.add_(2)
    b[1] = 7
    expected_a, expected_b = torch.full((3, 5), 3.0), torch.ones(3, 5)
    expected_b[1] = 7
    assert torch.equal(a.cpu(), expected_a) and torch.equal(b.cpu(), expected_b)
    assert torch.equal(torch.ones(3, 5, device="tpu").cpu(), torch.ones(3, 5))
    assert not torch.signbit(z.cpu()).any() and torch.signbit(nz.cpu()).all()
    i = torch.full((2,), 7, dtype=torch.int64, device="tpu")
    assert i.dtype == torch.int64 and torch.equal(i.cpu(), torch.full((2,), 7))


def test_copies_keep_torchs_strides_and_are_fresh_tensors():
    """clone/.contiguous()/.to() run as one program (ops/core.py) where the result is contiguous, and
    torch's own composite kernel where it keeps a permuted tensor's strides or leaves the device."""
    cpu = torch.randn(2, 3, 4)
    t = cpu.to(TPU)
    cases = {
        "clone of a permute keeps its strides": lambda x: x.permute(2, 0, 1).clone(),
        "clone contiguous_format": lambda x: x.permute(2, 0, 1).clone(memory_format=torch.contiguous_format),
        "clone of an expand": lambda x: x[:, :1].expand(2, 3, 4).clone(),
        ".contiguous()": lambda x: x.transpose(0, 2).contiguous(),
        ".to(dtype) of a permute keeps its strides": lambda x: x.permute(2, 0, 1).to(torch.float16),
        ".to(int)": lambda x: (x * 4).to(torch.int32),
        ".to(bool)": lambda x: x.round().to(torch.bool),
        ".to(copy=True)": lambda x: x.to(x.device, copy=True),
        ".to(cpu, float64)": lambda x: x.to("cpu", torch.float64),
    }
    for name, fn in cases.items():
        want, got = fn(cpu), fn(t)
        assert got.stride() == want.stride() and got.dtype == want.dtype, name
        assert torch.equal(got.cpu(), want), name
    a = torch.ones(3, device=TPU)
    b, c = a.clone(), a.to(torch.float32, copy=True)
    a.mul_(5)  # the copies do not alias it
    assert b.cpu().tolist() == c.cpu().tolist() == [1.0, 1.0, 1.0]


def test_complex_to_real_keeps_the_real_part_and_warns_as_cpu():
    c = torch.randn(4, dtype=torch.complex64)
    t = c.to(TPU)
    with pytest.warns(UserWarning, match="Casting complex values to real discards the imaginary part"):
        real = t.to(torch.float32)
    assert torch.equal(real.cpu(), c.real)
    out = torch.empty(4, device=TPU)
    with pytest.warns(UserWarning, match="discards the imaginary part"):
        out.copy_(t)
    assert torch.equal(out.cpu(), c.real)


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
def test_fills_of_new_tensors_run_no_program_and_record_nothing(fused):
    """``ones_like`` (every ``backward()``'s), ``torch.ones``/``full``/``zeros``/``zeros_like``: a fill of a
    never-written tensor takes a shared host-made array (``zero_`` leaves it: it reads as zeros), in
    eager and in fused mode alike; values equal CPU's; torch's overflow check still runs for each new
    value; fills of a written tensor or of part of a new one still write."""
    import tpu_interactive

    x = torch.randn(3, 4, device="tpu").sum()
    with tpu_interactive.fuse(fused):
        tpu_interactive.synchronize()
        before = tpu_interactive.stats()
        made = {"ones_like": lambda d: torch.ones_like(x.to(d)), "ones": lambda d: torch.ones(2, 3, device=d),
                "full half": lambda d: torch.full((3,), 2.5, dtype=torch.float16, device=d),
                "full bool": lambda d: torch.full((2, 2), True, device=d),
                "full int": lambda d: torch.full((4,), -7, dtype=torch.int32, device=d),
                "zeros": lambda d: torch.zeros(5, 2, device=d),
                "zeros_like int": lambda d: torch.zeros_like(x.to(d), dtype=torch.int64)}
        tpu = {name: fn("tpu") for name, fn in made.items()}
        counts = tpu_interactive.stats()["op_counts"]
        assert tpu_interactive.stats()["fused_ops"] == before["fused_ops"]  # nothing recorded
        assert counts["aten::fill_.Scalar"] - before["op_counts"].get("aten::fill_.Scalar", 0) == 4  # not ones_like
        for name, fn in made.items():
            assert_same(tpu[name], fn("cpu"))
        assert tpu_interactive.stats()["xla_compiles"] == before["xla_compiles"]  # nor compiled
        for value in (300, 127, 300):  # a value that passed does not excuse another
            call = lambda: torch.full((2,), value, dtype=torch.int8, device="tpu")  # noqa: E731
            if value == 127:
                assert torch.equal(call().cpu(), torch.full((2,), 127, dtype=torch.int8))
            else:
                with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
                    call()
        written = torch.ones(2, 3, device="tpu").mul_(4).fill_(1.5)  # a written buffer: a real fill
        part = torch.empty(3, 2, device="tpu")
        part[1].fill_(6.0)  # part of a never-written buffer (the rest reads as zeros)
        again = torch.zeros(2, 2, device="tpu").add_(3).zero_()
    assert torch.equal(written.cpu(), torch.full((2, 3), 1.5))
    assert torch.equal(part.cpu(), torch.tensor([[0.0, 0.0], [6.0, 6.0], [0.0, 0.0]]))
    assert torch.equal(again.cpu(), torch.zeros(2, 2))


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "fused"])
def test_ones_like_and_zeros_like_are_one_kernel_with_cpus_results(fused):
    """``ones_like``/``zeros_like`` run as one kernel (not torch's composite ``empty_like`` + fill, two
    Python kernels) where the result is a plain new tensor; every other call keeps the composite: the
    results (values, dtype, device, strides, errors) are CPU's either way."""
    base = torch.randn(2, 3, 4, 5)
    cases = {
        "plain": (base, {}), "dtype": (base, {"dtype": torch.int8}), "complex": (base, {"dtype": torch.complex64}),
        "half": (base, {"dtype": torch.float16}), "bool": (base > 0, {}), "contiguous format of a permuted":
        (base.permute(3, 1, 0, 2), {"memory_format": torch.contiguous_format}),
        "permuted keeps strides": (base.permute(3, 1, 0, 2), {}), "channels_last": (base, {"memory_format":
        torch.channels_last}), "to cpu": (base, {"device": "cpu"}), "0-d": (base.sum(), {}),
        "large": (torch.randn(300, 300), {}), "empty": (torch.randn(0, 3), {"dtype": torch.float64})}
    with tt.fuse(fused):
        for name, (x, kwargs) in cases.items():
            xt = x.to(TPU)
            for like in (torch.ones_like, torch.zeros_like):
                before = tt.stats()["op_counts"]
                got, want = like(xt, **kwargs), like(x, **kwargs)
                if name in ("plain", "dtype", "complex", "0-d", "contiguous format of a permuted"):
                    made = {op: n - before.get(op, 0) for op, n in tt.stats()["op_counts"].items()
                            if n != before.get(op, 0)}
                    assert made == {f"aten::{like.__name__}.default": 1}, (name, made)
                assert got.device.type == kwargs.get("device", "tpu"), name
                # (a memory format is accepted, the tensor made contiguous: docs/device_parity.md)
                assert got.stride() == (want.contiguous().stride() if name == "channels_last" else want.stride()), name
                torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
        with pytest.raises(RuntimeError) as cpu_error:
            torch.ones_like(base[0], memory_format=torch.channels_last)
        with pytest.raises(RuntimeError) as tpu_error:
            torch.ones_like(base[0].to(TPU), memory_format=torch.channels_last)
        assert str(tpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]


def test_a_new_zeros_tensor_read_in_fused_mode_records_its_zeros_once():
    """``torch.zeros`` leaves its buffer unwritten; in fused mode its first read records the zeros and
    keeps them (later reads are a plain buffer's); a segment that fails before that read leaves it
    reading zeros still, and a ``torch.ones`` made after the failing op reading ones."""
    import tpu_interactive
    from tpu_interactive.backend import fusion

    with tpu_interactive.fuse():
        tpu_interactive.synchronize()
        z = torch.zeros(4, 3, device="tpu")
        outs = [z + 1, z * 2, z - 3, z + 1]
        steps = [step[3] for step in fusion.current().steps]
        assert steps.count("tensor read/write") == 1, steps
    for out, cpu in zip(outs, [torch.ones(4, 3), torch.zeros(4, 3), torch.full((4, 3), -3.0), torch.ones(4, 3)]):
        assert torch.equal(out.cpu(), cpu)
    with tpu_interactive.fuse():
        tpu_interactive.synchronize()
        fresh = torch.zeros(5, device="tpu")
        bad = torch.arange(12.0, device="tpu").reshape(3, 4).gather(1, torch.tensor([[0, 9]], device="tpu"))
        shifted = fresh + 1  # fresh's zeros recorded after the failing op: undone with the segment
        ones = torch.ones(2, 3, device="tpu")  # made after it: a fill that depends on nothing stands
        with pytest.raises(RuntimeError, match="out of bounds"):  # its check runs with the segment
            bad.cpu()
        assert torch.equal(fresh.cpu(), torch.zeros(5)) and torch.equal(ones.cpu(), torch.ones(2, 3))
        with pytest.raises(RuntimeError, match="never computed"):
            shifted.cpu()
