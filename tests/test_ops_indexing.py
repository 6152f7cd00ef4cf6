"""Indexing, scatter/gather, mask, unique/search and shape ops on tpu vs CPU PyTorch."""
import pytest
import torch
import torch.nn.functional as F

from helpers import TPU, assert_same, check, raises_like_cpu, to_tpu

pytestmark = pytest.mark.usefixtures("no_fallback")

g = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def randint(high, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, generator=g).to(dtype)


def grads(fn, *inputs):
    """Gradients of sum(fn(*inputs) * weights) w.r.t. the float inputs, on CPU and on tpu."""
    results = []
    for device_inputs in (inputs, to_tpu(inputs)):
        leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in device_inputs]
        out = fn(*leaves)
        w = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).to(out.device)
        (out * w).sum().backward()
        results.append([x.grad for x in leaves if x.requires_grad])
    assert_same(results[1], results[0])


# ---------------------------------------------------------------- advanced indexing (index.Tensor)
IDX_CASES = [
    lambda x, i: x[i],
    lambda x, i: x[:, i],
    lambda x, i: x[i, i],
    lambda x, i: x[i[:, None], i],          # broadcasting index tensors
    lambda x, i: x[None, i],                # None entry (new axis)
    lambda x, i: x[..., i],
    lambda x, i: x[i, 1:],
    lambda x, i: x[1:, i],
    lambda x, i: x[-i - 1],                 # negative indices
]


@pytest.mark.parametrize("case", range(len(IDX_CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_tensor(case, dtype):
    x = randn(4, 4).to(dtype) if dtype != torch.bool else randn(4, 4) > 0
    i = torch.tensor([0, 3, 3, 1])
    check(IDX_CASES[case], x, i)


def test_index_non_adjacent_advanced_goes_first():
    x = randn(3, 4, 5)
    i, j = torch.tensor([0, 2]), torch.tensor([1, 4])
    check(lambda x, i, j: x[i, :, j], x, i, j)
    check(lambda x, i, j: x[:, i][:, :, j], x, i, j)


def test_index_int32_and_cpu_indices_and_noncontiguous():
    x = randn(5, 6)
    i32 = torch.tensor([4, 0, 2], dtype=torch.int32)
    check(lambda x, i: x[i], x, i32)
    xt = x.to(TPU)
    assert_same(xt[torch.tensor([1, 2])], x[torch.tensor([1, 2])])         # CPU index tensor, as on CUDA
    assert_same(xt.t()[torch.tensor([5, 0])], x.t()[torch.tensor([5, 0])])  # transposed input
    assert_same(xt[::2][torch.tensor([2, 0])], x[::2][torch.tensor([2, 0])])
    # 0-dim index tensor and empty index tensor
    check(lambda x: x[torch.tensor(2, device=x.device)], x)
    check(lambda x: x[torch.tensor([], dtype=torch.int64, device=x.device)], x)


def test_index_bool_mask():
    x = randn(4, 5)
    m = x > 0
    check(lambda x, m: x[m], x, m)
    check(lambda x, m: x[m[:, 0]], x, m)
    check(lambda x, m: x[:, m[0]], x, m)
    check(lambda x, m: x[m[:, 0], 1:3], x, m)
    check(lambda x, m: x[m & False], x, m)  # no hits
    xt = x.to(TPU)
    assert_same(xt[m], x[m])  # CPU mask


@pytest.mark.parametrize("form", [
    lambda x: x[True], lambda x: x[False], lambda x: x[[0, 2]], lambda x: x[[0, 2], [1, 1]],
    lambda x: x[torch.tensor(True, device=x.device)], lambda x: x[torch.tensor(False, device=x.device)],
    lambda x: x[torch.tensor([1, 0, 1], dtype=torch.uint8, device=x.device)],  # legacy byte mask
    lambda x: x[torch.tensor(1, device=x.device), 2], lambda x: x[1, torch.tensor([True, False, True, True])],
])
def test_python_indexing_forms(form):
    check(form, randn(3, 4))


def test_index_put_with_cpu_indices():
    x = randn(3, 4)
    xt = x.to(TPU)
    xt[torch.tensor([0, 2])] = 5.0
    x[torch.tensor([0, 2])] = 5.0
    xt[torch.tensor([1]), torch.tensor([3])] = torch.tensor(-1.0)
    x[torch.tensor([1]), torch.tensor([3])] = torch.tensor(-1.0)
    assert_same(xt, x)


def test_index_errors_like_cpu():
    xt = torch.zeros(3, 4, device=TPU)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        xt[torch.tensor([0, 3], device=TPU)]
    with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 1 with size 4"):
        xt[:, torch.tensor([-5], device=TPU)]
    with pytest.raises(IndexError, match="shape of the mask"):
        xt[torch.ones(4, dtype=torch.bool, device=TPU)]
    with pytest.raises((IndexError, RuntimeError), match="too many indices"):
        torch.ops.aten.index.Tensor(xt, [torch.tensor([0])] * 3)
    with pytest.raises(IndexError):
        xt[torch.tensor([0.5], device=TPU)]


def test_index_grad():
    grads(lambda x: x[torch.tensor([0, 2, 2], device=x.device)], randn(4, 3))
    grads(lambda x: x[:, torch.tensor([1, 1], device=x.device)], randn(4, 3))
    m = torch.tensor([True, False, True, True])
    grads(lambda x: x[m.to(x.device)], randn(4, 3))


# ---------------------------------------------------------------- index_put / setitem
def _put(fn):
    def run(x, *args):
        y = x.clone()
        fn(y, *args)
        return y
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_setitem_forms(dtype):
    x = randn(5, 4).to(dtype)
    m = randn(5, 4) > 0
    i = torch.tensor([0, 3, 1])
    v = randn(3, 4).to(dtype)

    def assign_mask(y, m):
        y[m] = 0

    def assign_idx(y, i, v):
        y[i] = v

    def iadd_idx(y, i, v):
        y[i] += v

    check(_put(assign_mask), x, m)
    check(_put(assign_mask), x, m[:, 0])
    check(_put(assign_idx), x, i, v)
    check(_put(iadd_idx), x, i, v)
    check(_put(lambda y, i: y.__setitem__((slice(None), i[:2]), 7)), x, i)
    check(_put(lambda y, i, v: y.__setitem__(i, v[0])), x, i, v)  # broadcast row


def test_setitem_mask_with_values():
    x = randn(4, 3)
    m = torch.tensor([True, False, True, True])
    check(_put(lambda y, m: y.__setitem__(m, torch.arange(9.).reshape(3, 3).to(y.device))), x, m)
    check(_put(lambda y, m: y.__setitem__(m, torch.arange(3.).to(y.device))), x, m)  # row broadcast (fast path)
    mm = randn(4, 3) > 0
    check(_put(lambda y, mm: y.__setitem__(mm, torch.arange(float(mm.sum())).to(y.device))), x, mm)
    check(_put(lambda y, m: y.__setitem__((slice(None), m[:3]), 5.0)), x, m)  # mask after a slice


def test_index_put_accumulate_duplicates():
    x = randn(6, 2)
    i = torch.tensor([0, 0, 5, 0, -1])
    v = randn(5, 2)
    check(lambda x, i, v: x.index_put((i,), v, accumulate=True), x, i, v)
    check(lambda x, i, v: x.clone().index_put_((i,), v, accumulate=True), x, i, v)
    check(lambda x, i, v: torch.ops.aten._index_put_impl_(x.clone(), (i,), v, True, False), x, i, v)
    m = torch.tensor([True, False, True, False, False, True])
    check(lambda x, m: x.index_put((m,), torch.tensor(2.0, device=x.device), accumulate=True), x, m)
    xi = randint(10, 6)
    check(lambda x, i: x.index_put((i,), torch.tensor(3, device=x.device), accumulate=True), xi, i)
    check(lambda x, i: x.index_put((i, ), torch.tensor(3, device=x.device)), xi, torch.tensor([1, 2]))


def test_index_put_errors_and_grad():
    xt = torch.zeros(3, device=TPU)
    with pytest.raises(IndexError, match="index 3 is out of bounds"):
        xt[torch.tensor([3], device=TPU)] = 1.0
        xt.cpu()  # fused mode raises it here, where its segment runs
    with pytest.raises(RuntimeError, match="dtype"):
        xt.index_put_((torch.tensor([0], device=TPU),), torch.tensor([1], device=TPU))
    i = torch.tensor([0, 2])
    grads(lambda x, v: x.index_put((i.to(x.device),), v, accumulate=True), randn(4), randn(2))
    grads(lambda x, v: x.index_put((i.to(x.device),), v), randn(4), randn(2))


# ---------------------------------------------------------------- gather / scatter family
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_gather(dtype):
    x = randn(4, 5).to(dtype)
    check(lambda x, i: x.gather(1, i), x, randint(5, 4, 3))
    check(lambda x, i: x.gather(0, i), x, randint(4, 2, 5))
    check(lambda x, i: x.gather(-1, i), x, randint(5, 2, 2))       # index smaller than self
    check(lambda x, i: x.t().gather(0, i), x, randint(4, 3, 4))    # non-contiguous input
    check(lambda x, i: x.gather(1, i), x, randint(5, 4, 0))        # empty index
    check(lambda x, i: x[0, 0].gather(0, i), x, torch.tensor(0))   # 0-dim


@pytest.mark.eager_only
def test_gather_errors_and_grad():
    xt = torch.zeros(3, 4, device=TPU)
    with pytest.raises(RuntimeError, match="index 4 is out of bounds for dimension 1 with size 4"):
        xt.gather(1, torch.tensor([[4]], device=TPU))
    with pytest.raises(RuntimeError, match="out of bounds"):
        xt.gather(1, torch.tensor([[-1]], device=TPU))
    grads(lambda x: x.gather(1, torch.tensor([[0, 0], [1, 3], [2, 2]], device=x.device)), randn(3, 4))


SCATTER_CASES = {
    "src": lambda x, i, s: x.scatter(1, i, s),
    "value": lambda x, i, s: x.scatter(1, i, 2.5 if x.is_floating_point() else 2),
    "add": lambda x, i, s: x.scatter_add(1, i, s),
    "reduce_add": lambda x, i, s: x.scatter(1, i, s, reduce="add"),
    "reduce_mul": lambda x, i, s: x.scatter(1, i, s, reduce="multiply"),
    "value_reduce": lambda x, i, s: x.scatter(1, i, 3, reduce="multiply"),
    "inplace": lambda x, i, s: x.clone().scatter_add_(1, i, s),
    "dim0": lambda x, i, s: x.scatter_add(0, i[:3].clamp(max=3), s),
}


@pytest.mark.parametrize("case", list(SCATTER_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter(case, dtype):
    x = randn(4, 6).to(dtype) * 3
    # index with duplicates along dim only for accumulating forms; unique for plain src/value scatter
    i = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(4)])
    if case not in ("src", "value"):
        i[:, 0] = i[:, 1]
    s = randn(4, 5).to(dtype) * 3  # larger than index: only index.shape is used
    check(SCATTER_CASES[case], x, i, s)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce(reduce, include_self, dtype):
    x = (randn(3, 5) * 5).to(dtype)
    i = torch.tensor([[0, 0, 1, 4], [2, 2, 2, 2], [4, 3, 4, 3]])
    s = (randn(3, 4) * 5).to(dtype)
    check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self), x, i, s)
    check(lambda x, i, s: x.clone().scatter_reduce_(0, i[:2].clamp(max=2), s[:2], reduce, include_self=include_self), x, i, s)


@pytest.mark.eager_only
def test_scatter_reduce_nan_and_grad():
    x = torch.tensor([1.0, 2.0, 3.0])
    s = torch.tensor([float("nan"), 5.0])
    i = torch.tensor([0, 1])
    for reduce in ("amax", "amin", "sum"):
        check(lambda x, i, s: x.scatter_reduce(0, i, s, reduce), x, i, s)
    grads(lambda x, s: x.scatter_add(0, torch.tensor([0, 0, 2], device=x.device), s), randn(3), randn(3))
    grads(lambda x, s: x.scatter(0, torch.tensor([2, 0], device=x.device), s), randn(3), randn(2))
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.zeros(3, device=TPU).scatter_(0, torch.tensor([3], device=TPU), 1.0)


# ---------------------------------------------------------------- index_* along a dim
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_select(dtype):
    x = (randn(4, 5) * 3).to(dtype)
    i = torch.tensor([3, 0, 0])
    check(lambda x, i: x.index_select(0, i), x, i)
    check(lambda x, i: x.index_select(-1, i), x, i)
    check(lambda x, i: x.t().index_select(1, i), x, i)
    check(lambda x, i: x[1, 1].index_select(0, i[1:2]), x, i)  # 0-dim self
    check(lambda x, i: x.index_select(1, i[:0]), x, i)


@pytest.mark.eager_only
def test_index_select_errors_and_grad():
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.zeros(3, device=TPU).index_select(0, torch.tensor([3], device=TPU))
    grads(lambda x: x.index_select(0, torch.tensor([1, 1, 0], device=x.device)), randn(3, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_add_copy_fill(dtype):
    x = (randn(5, 3) * 3).to(dtype)
    src = (randn(4, 3) * 3).to(dtype)
    dup = torch.tensor([0, 4, 0, 2])
    uniq = torch.tensor([4, 1, 0, 2])
    check(lambda x, i, s: x.index_add(0, i, s), x, dup, src)
    check(lambda x, i, s: x.index_add(0, i, s, alpha=2), x, dup, src)
    check(lambda x, i, s: x.clone().index_add_(1, i, s.t().t()), x, torch.tensor([2, 0]), x[:, :2].clone())
    check(lambda x, i, s: x.index_copy(0, i, s), x, uniq, src)
    check(lambda x, i, s: x.clone().index_copy_(0, i, s), x, uniq, src)
    check(lambda x, i: x.index_fill(1, i, 7), x, torch.tensor([0, -1]))
    check(lambda x, i: x.clone().index_fill_(0, i, torch.tensor(-3)), x, torch.tensor([1, 3]))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x = randn(5, 3)
    src = randn(4, 3)
    i = torch.tensor([0, 4, 0, 2])
    check(lambda x, i, s: x.index_reduce(0, i, s, reduce, include_self=include_self), x, i, src)


@pytest.mark.eager_only
def test_index_add_copy_errors_and_grad():
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.zeros(3, device=TPU).index_add_(0, torch.tensor([-1], device=TPU), torch.ones(1, device=TPU))
    with pytest.raises(IndexError, match="index_copy_"):
        torch.zeros(3, device=TPU).index_copy_(0, torch.tensor([3], device=TPU), torch.ones(1, device=TPU))
    i = torch.tensor([2, 0, 2])
    grads(lambda x, s: x.index_add(0, i.to(x.device), s), randn(3, 2), randn(3, 2))
    grads(lambda x, s: x.index_copy(0, i[:2].to(x.device), s), randn(3, 2), randn(2, 2))


@pytest.mark.parametrize("shape, dim, index_dtype, alpha, error", [
    ((3, 4), 0, torch.int64, 1, RuntimeError), ((4, 3), -1, torch.int64, 1, RuntimeError),  # CPU's scatter_add path
    ((3, 4), 0, torch.int32, 1, IndexError), ((3, 4), 1, torch.int64, 2, IndexError),
    ((3, 4, 2), 1, torch.int64, 1, IndexError), ((3,), 0, torch.int64, 1, IndexError),
])
def test_index_add_bad_index_in_the_words_of_cpus_kernel_path(shape, dim, index_dtype, alpha, error):
    """CPU's index_add runs as scatter_add for an outer or inner dim with int64 indices, alpha 1 and a
    source shaped as self (RuntimeError "index 7 is out of bounds ..."), else its own loop (IndexError
    "index out of range in self")."""
    source_shape = list(shape)
    source_shape[dim] = 2
    x, source, index = torch.zeros(shape), torch.ones(source_shape), torch.tensor([0, 7], dtype=index_dtype)
    for fn in (lambda x, i, s: x.index_add(dim, i, s, alpha=alpha), lambda x, i, s: x.clone().index_add_(dim, i, s, alpha=alpha)):
        raises_like_cpu(fn, x, index, source, expected=error)


@pytest.mark.parametrize("self_shape, source_shape", [((), (1,)), ((1,), ()), ((3,), (1, 1)), ((2, 3), (1, 3, 1)),
                                                    ((3, 2), (2, 3))])
def test_index_add_reduce_source_shape_errors_like_cpu(self_shape, source_shape):
    # torch's C++ meta refuses these (CUDA's words too); its Python meta, which we run, lets them through:
    # accepted, the source was silently reshaped into self's slices
    index = torch.tensor([0, 1][:1 if source_shape[:1] in ((), (1,)) else 2])
    x, source = torch.zeros(self_shape), torch.ones(source_shape)
    for fn in (lambda x, i, s: x.index_add(0, i, s), lambda x, i, s: x.clone().index_add_(0, i, s, alpha=2),
               lambda x, i, s: x.index_reduce(0, i, s, "amax")):
        raises_like_cpu(fn, x, index, source)


@pytest.mark.eager_only
def test_index_ops_check_and_compute_in_one_program():
    # plain eager runs the index check with the op (then one sync): a new shape compiles one program
    import tpu_interactive as tt

    x = randn(41, 3)
    calls = {"index_select": lambda x, i, s: x.index_select(0, i),
             "index_add": lambda x, i, s: x.index_add(0, i, s, alpha=-0.5),
             "index_copy": lambda x, i, s: x.index_copy(0, i, s),
             "index_reduce": lambda x, i, s: x.index_reduce(0, i, s, "amax", include_self=False)}
    # a 0-dim index is flattened inside the program too (not by an eager reshape of its own)
    for index, bad, source in ((torch.tensor([40, 0, 7]), torch.tensor([1, 41, 2]), randn(3, 3)),
                               (torch.tensor(23), torch.tensor(41), randn(1, 3))):
        for name, fn in calls.items():
            before = tt.stats()["xla_compiles"]
            assert_same(fn(*to_tpu((x, index, source))), fn(x, index, source))
            compiled = [c["op"] for c in tt.stats()["recent_xla_compiles"]][before - tt.stats()["xla_compiles"]:]
            assert compiled == [f"aten::{name}.default"], (name, compiled)
            with pytest.raises(IndexError, match="index out of range in self|index 41 is out of bounds"):
                fn(*to_tpu((x, bad, source)))


@pytest.mark.eager_only
def test_take_put():
    x = randn(3, 4)
    i = torch.tensor([[0, -1], [11, 5]])
    check(lambda x, i: x.take(i), x, i)
    check(lambda x, i: x.t().take(i), x, i)
    check(lambda x, i, s: x.put(i, s), x, torch.tensor([0, 5, -1]), randn(3))
    check(lambda x, i, s: x.clone().put_(i, s, accumulate=True), x, torch.tensor([0, 0, 5]), randn(3))
    with pytest.raises(IndexError, match="out of range"):
        x.to(TPU).take(torch.tensor([12], device=TPU))
    grads(lambda x: x.take(torch.tensor([1, 1, 3], device=x.device)), randn(2, 2))


# ---------------------------------------------------------------- masks
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_masked_fill(dtype):
    x = (randn(4, 5) * 3).to(dtype)
    m = randn(4, 5) > 0
    check(lambda x, m: x.masked_fill(m, 1), x, m)
    check(lambda x, m: x.masked_fill(m[0], 0), x, m)                       # mask broadcasts
    check(lambda x, m: x.clone().masked_fill_(m, torch.tensor(1)), x, m)    # 0-dim tensor value
    check(lambda x, m: x.t().masked_fill(m.t(), 0), x, m)
    xt = x.to(TPU)
    assert_same(xt.masked_fill(m.to(TPU), torch.tensor(2)), x.masked_fill(m, torch.tensor(2)))  # cpu 0-dim value


def test_masked_fill_float_value_and_grad():
    x = randn(3, 4)
    m = randn(3, 4) > 0
    check(lambda x, m: x.masked_fill(m, float("-inf")), x, m)
    check(lambda x, m: x.masked_fill(m, torch.tensor(0.5, device=x.device)), x, m)
    grads(lambda x: x.masked_fill(m.to(x.device), 0.0), x)


def test_masked_select_scatter():
    x = randn(4, 5)
    m = randn(4, 5) > 0
    check(lambda x, m: x.masked_select(m), x, m)
    check(lambda x, m: x.masked_select(m[0]), x, m)        # broadcast mask
    check(lambda x, m: x[0].masked_select(m), x, m)        # broadcast self
    check(lambda x, m: x.masked_select(m & False), x, m)
    src = randn(20)
    check(lambda x, m, s: x.masked_scatter(m, s), x, m, src)
    check(lambda x, m, s: x.clone().masked_scatter_(m[0], s.reshape(4, 5)), x, m, src)
    with pytest.raises(RuntimeError, match="masked_scatter"):
        x.to(TPU).masked_scatter(torch.ones(4, 5, dtype=torch.bool, device=TPU), torch.ones(3, device=TPU))
    grads(lambda x: x.masked_select(m.to(x.device)), x)
    grads(lambda x, s: x.masked_scatter(m.to(x.device), s), x, src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_nonzero_argwhere(dtype):
    x = (randn(3, 4) > 0.3).to(dtype)
    check(lambda x: x.nonzero(), x)
    check(lambda x: torch.argwhere(x), x)
    check(lambda x: x.nonzero(as_tuple=True), x)
    check(lambda x: x[0, 0].nonzero(), x)
    check(lambda x: x[:0].nonzero(), x)
    check(lambda x: x.t().nonzero(), x)
    check(lambda x: torch.nonzero_static(x, size=8), x)


# ---------------------------------------------------------------- unique / bincount / search
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = randint(4, 3, 5).to(dtype)
    for kw in ({}, {"return_inverse": True}, {"return_counts": True},
               {"return_inverse": True, "return_counts": True}, {"sorted": False, "return_inverse": True}):
        check(lambda x: torch.unique(x, **kw), x)
        check(lambda x: torch.unique(x, dim=1, **kw), x)
        check(lambda x: torch.unique_consecutive(x, **{k: v for k, v in kw.items() if k != "sorted"}), x)
        check(lambda x: torch.unique_consecutive(x, dim=0, **{k: v for k, v in kw.items() if k != "sorted"}), x)
    check(lambda x: torch.unique(x[:0], return_inverse=True, return_counts=True), x)
    check(lambda x: torch.unique(x[0, 0], return_inverse=True, return_counts=True), x)


def test_bincount_histc():
    x = randint(6, 20)
    check(lambda x: torch.bincount(x), x)
    check(lambda x: torch.bincount(x, minlength=10), x)
    check(lambda x, w: torch.bincount(x, w), x, randn(20))
    check(lambda x, w: torch.bincount(x, w), x, randn(20, dtype=torch.float64))
    check(lambda x: torch.bincount(x[:0]), x)
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([-1], device=TPU))
    y = randn(100)
    check(lambda y: torch.histc(y, bins=7), y)
    check(lambda y: torch.histc(y, bins=5, min=-1, max=1), y)
    check(lambda y: torch.histc(y[:1], bins=3), y)
    check(lambda y: torch.histc(torch.tensor([0.0, 1.0, 2.0, 3.0], device=y.device), bins=3, min=0, max=3), y)


def test_searchsorted_bucketize():
    seq = torch.sort(randn(10)).values
    vals = randn(3, 4)
    for right in (False, True):
        check(lambda s, v: torch.searchsorted(s, v, right=right), seq, vals)
        check(lambda s, v: torch.bucketize(v, s, right=right), seq, vals)
    check(lambda s, v: torch.searchsorted(s, v, side="right", out_int32=True), seq, vals)
    check(lambda s, v: torch.searchsorted(s, seq[3].item()), seq, vals)
    check(lambda s: torch.bucketize(0.1, s), seq)
    batched = torch.sort(randn(3, 6)).values
    check(lambda s, v: torch.searchsorted(s, v), batched, vals)
    unsorted = randn(7)
    check(lambda s, v, o: torch.searchsorted(s, v, sorter=o), unsorted, vals, torch.argsort(unsorted))
    check(lambda s, v: torch.searchsorted(s, v), torch.tensor([1, 3, 5, 7]), torch.tensor([[0, 3], [6, 9]]))


def test_repeat_interleave():
    x = randn(3, 2)
    r = torch.tensor([1, 0, 3])
    check(lambda r: torch.repeat_interleave(r), r)
    check(lambda x, r: x.repeat_interleave(r, dim=0), x, r)
    check(lambda x: x.repeat_interleave(2, dim=1), x)
    check(lambda x: x.repeat_interleave(2), x)


# ---------------------------------------------------------------- cat / stack and shape copies
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_cat_stack(dtype):
    a, b = (randn(2, 3) * 3).to(dtype), (randn(4, 3) * 3).to(dtype)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, b: torch.cat([a.t(), b.t()], dim=-1), a, b)
    check(lambda a, b: torch.cat([a, b[:0], b]), a, b)
    check(lambda a: torch.cat([a, torch.empty(0, dtype=a.dtype, device=a.device)]), a)  # legacy 1-d empty
    check(lambda a: torch.cat([a[:0], a[:0]]), a)
    check(lambda a, b: torch.stack([a, b[:2]], dim=1), a, b)
    check(lambda a, b: torch.stack([a[0, 0], b[0, 0]]), a, b)
    out = torch.empty(6, 3, dtype=dtype)
    check(lambda a, b, o: torch.cat([a, b], out=o), a, b, out)


def test_cat_mixed_dtypes_and_grad():
    a, b, c = randn(2, 2), randint(5, 2, 2), randn(2, 2, dtype=torch.bfloat16)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda b, c: torch.cat([b, c]), b, c)
    check(lambda a, c: torch.stack([c, a]), a, c)
    check(lambda b: torch.cat([b, torch.ones(2, 2, dtype=torch.bool, device=b.device)]), b)
    grads(lambda a, b: torch.cat([a, b], dim=1), randn(2, 2), randn(2, 3))
    grads(lambda a, b: torch.stack([a, b], dim=-1), randn(2, 2), randn(2, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_flip_roll_repeat_tril(dtype):
    x = (randn(3, 4, 5) * 3).to(dtype)
    check(lambda x: x.flip(0), x)
    check(lambda x: x.flip(-1, 1), x)
    check(lambda x: x.transpose(0, 2).flip(1), x)
    check(lambda x: x.roll(2), x)
    check(lambda x: x.roll((1, -2), (0, 2)), x)
    check(lambda x: x.repeat(2, 1, 3), x)
    check(lambda x: x.repeat(2, 1, 1, 2), x)
    check(lambda x: x[0, 0, 0].repeat(3), x)
    for k in (0, 1, -2, 7):
        check(lambda x: x.tril(k), x)
        check(lambda x: x.triu(k), x)
        check(lambda x: x.transpose(1, 2).triu(k), x)


def test_shape_grads():
    grads(lambda x: x.flip(0, 1), randn(3, 4))
    grads(lambda x: x.roll(1, 0), randn(3, 4))
    grads(lambda x: x.repeat(2, 3), randn(3, 4))
    grads(lambda x: x.tril(-1) + x.triu(2), randn(3, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_constant_pad(dtype):
    x = (randn(2, 3, 4) * 3).to(dtype)
    check(lambda x: F.pad(x, (1, 2)), x)
    check(lambda x: F.pad(x, (1, 2, 0, 3), value=5), x)
    check(lambda x: F.pad(x, (-1, 2, 1, -1)), x)  # negative padding crops
    check(lambda x: F.pad(x.transpose(0, 2), (1, 1, 1, 1, 1, 1)), x)
    grads(lambda x: F.pad(x, (2, -1, 1, 1)), randn(2, 3, 4))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_reflect_replicate_pad(mode):
    x1, x2, x3 = randn(2, 3, 6), randn(2, 3, 5, 6), randn(1, 2, 4, 5, 6)
    check(lambda x: F.pad(x, (2, 3), mode=mode), x1)
    check(lambda x: F.pad(x, (1, 2, 3, 1), mode=mode), x2)
    check(lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode=mode), x3)
    check(lambda x: F.pad(x, (2, 3), mode=mode), x1[0])  # unbatched
    check(lambda x: F.pad(x.transpose(2, 3), (1, 2, 1, 1), mode=mode), x2)
    grads(lambda x: F.pad(x, (2, 3), mode=mode), x1)
    grads(lambda x: F.pad(x, (1, 2, 3, 1), mode=mode), x2)
    grads(lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode=mode), x3)


def test_diag_embed_and_scatters():
    x = randn(2, 3)
    for off, d1, d2 in ((0, -2, -1), (1, 0, 2), (-2, 2, 0)):
        check(lambda x: torch.diag_embed(x, off, d1, d2), x)
    m = randn(3, 4, 5)
    check(lambda m, s: torch.diagonal_scatter(m, s, 1, 0, 2), m, randn(4, 3))
    check(lambda m, s: torch.diagonal_scatter(m, s), m, randn(5, 3))
    check(lambda m, s: torch.select_scatter(m, s, 1, -1), m, randn(3, 5))
    check(lambda m, s: torch.slice_scatter(m, s, 2, 1, None, 2), m, randn(3, 4, 2))
    check(lambda m, s: torch.slice_scatter(m, s, 0, -2), m, randn(2, 4, 5))
    check(lambda m, s: torch.as_strided_scatter(m, s, (2, 2), (5, 2), 3), m, randn(2, 2))
    check(lambda m: torch.narrow_copy(m, 1, -3, 2), m)
    check(lambda m: torch.narrow_copy(m.transpose(0, 2), 0, 1, 3), m)
    grads(lambda x: torch.diag_embed(x, 1), x)
    grads(lambda m, s: torch.diagonal_scatter(m, s), m, randn(5, 3))
    grads(lambda m, s: torch.slice_scatter(m, s, 2, 1, None, 2), m, randn(3, 4, 2))


def test_unfold_backward():
    for dim, size, step in ((1, 2, 1), (0, 2, 2), (-1, 3, 2), (1, 4, 1)):
        grads(lambda x: x.unfold(dim, size, step), randn(4, 5))
    grads(lambda x: x.t().unfold(0, 2, 3), randn(4, 5))
    check(lambda g: torch.ops.aten.unfold_backward(g, [3, 6, 2], 1, 3, 2), randn(3, 2, 2, 3))


def test_select_and_slice_backward_are_pads_of_the_gradient():
    """Lowered as one pad (not zeros + a copy into a view): every index/bound form torch accepts, the
    dtypes autograd gives them, and the values CPU's composite kernel makes (exact: only copies)."""
    for sizes, dim, index in (((3, 4, 5), 0, 1), ((3, 4, 5), 1, -1), ((3, 4, 5), -1, 4), ((1, 2), 0, 0)):
        grad = randn(*[n for d, n in enumerate(sizes) if d != dim % len(sizes)])
        check(lambda g: torch.ops.aten.select_backward(g, sizes, dim, index), grad, tol="exact")
    for sizes, dim, start, end, step in (((10, 3), 0, 2, 9, 3), ((10, 3), 0, -5, 100, 2), ((10, 3), 1, 0, 3, 1),
                                         ((10, 3), 0, 4, 4, 1), ((10, 3), 0, -100, 7, 4), ((10,), -1, 9, 100, 5)):
        n = len(range(*slice(start, end, step).indices(sizes[dim])))
        grad = randn(*[n if d == dim % len(sizes) else m for d, m in enumerate(sizes)])
        check(lambda g: torch.ops.aten.slice_backward(g, sizes, dim, start, end, step), grad, tol="exact")
    for dtype in (torch.bfloat16, torch.complex64):
        check(lambda g: torch.ops.aten.select_backward(g, (2, 3), 1, 2), randn(2).to(dtype), tol="exact")
    # calls autograd would not make: torch's kernel, its broadcast or its error
    check(lambda g: torch.ops.aten.slice_backward(g, (6, 2), 0, 1, 5, 1), randn(1, 2), tol="exact")
    check(lambda g: torch.ops.aten.select_backward(g, (3, 4), 1, 0), randn(1), tol="exact")
    for bad, grad in ((lambda g: torch.ops.aten.select_backward(g, (3, 4), 1, 4), randn(3)),
                      (lambda g: torch.ops.aten.slice_backward(g, (6, 2), 0, 1, 5, 1), randn(3, 2)),
                      (lambda g: torch.ops.aten.slice_backward(g, (6, 2), 0, 1, 5, 0), randn(3, 2))):
        with pytest.raises((IndexError, RuntimeError)) as on_cpu:
            bad(grad)
        with pytest.raises(type(on_cpu.value)) as on_tpu:
            bad(grad.to(TPU))
        assert str(on_tpu.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
    # through autograd: nn.MultiheadAttention's packed projection (three selects) and strided slices
    grads(lambda p: p.unflatten(-1, (3, 4)).movedim(-2, 0)[0] * 2 + p.unflatten(-1, (3, 4)).movedim(-2, 0)[2],
          randn(5, 12))
    grads(lambda x: x[1:, ::2].sin() + x[:-1, 1::2], randn(4, 6))


def test_clone_contiguous_paths():
    x = randn(4, 6)
    check(lambda x: x.t().clone(), x)
    check(lambda x: x.t().contiguous(), x)
    check(lambda x: x[::2, 1::3].contiguous(), x)
    check(lambda x: x.t().clone(memory_format=torch.contiguous_format), x)
    check(lambda x: x.expand(3, 4, 6).clone(), x)
    xt = x.to(TPU).t()
    c = xt.contiguous()
    assert c.is_contiguous() and not xt.is_contiguous()
    assert xt.contiguous().data_ptr() != xt.data_ptr()
    y = x.to(TPU)
    assert y.contiguous() is y


# ---------------------------------------------------------------- printing runs on the device only
@pytest.mark.parametrize("make", [
    lambda: torch.randn(3, 3),
    lambda: torch.tensor([True, False, True]),
    lambda: torch.arange(12).reshape(3, 4),
    lambda: torch.randn(4).bfloat16(),
    lambda: torch.empty(0, 3),
    lambda: torch.randn(2000),
    lambda: torch.randn(40, 40),
    lambda: torch.tensor([1.0, float("nan"), float("inf"), -2.5e10]),
    lambda: torch.tensor(3.5),
])
def test_repr_matches_cpu(make):
    x = make()
    text = repr(x.to(TPU))
    assert "device='tpu:0'" in text
    squash = lambda s: "".join(s.split()).replace(",device='tpu:0'", "")  # noqa: E731 (line breaks differ)
    assert squash(text) == squash(repr(x))
