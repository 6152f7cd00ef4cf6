"""The ``tpu`` c10d backend: ``torch.distributed`` on tpu tensors over JAX's multi-process runtime.

``dist.init_process_group("tpu")`` (or no backend name when the accelerator is tpu) under torchrun
creates a :class:`TPUProcessGroup`; its collectives are XLA collectives over a mesh of one device per
process (see ``collectives.py``). Python process groups are a documented torch extension point
(``Backend.register_backend``; torch's own test_c10d_pypg/fake_pg use it).

Each collective first exchanges a small signature (collective, reduction/root, dtype, shape) through
the group's c10d store so ranks that issued different collectives or shapes get an error naming them
instead of a hang (``check_collectives``). The exchange is host-only: it does not wait for the device
to finish the work queued before the collective, as a device all-gather read on the host did.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from . import collectives, jax_runtime, storage

BACKEND = "tpu"
ALIAS = "tpu_dist"
_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "gather", "scatter",
          "reduce", "send/recv", "compiled_graph")
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_MAX_DIMS = 8
check_collectives = True  # the signature pre-check (off: one collective per call, mismatches may hang)


def _op_name(op) -> str:
    for red, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "product"),
                      (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.MAX, "max")):
        if op == red:
            return name
    raise ValueError(f"tpu process group: reduce op {op} is not supported (SUM, AVG, PRODUCT, MIN, MAX are)")


def _read(t: torch.Tensor) -> jax.Array:
    """The tensor's value as a jax array on this process's device (CPU tensors are copied up)."""
    return storage.read(t if t.device.type == "tpu" else t.to("tpu"))


def _store(t: torch.Tensor, value: jax.Array) -> None:
    if t.device.type == "tpu":
        storage.write(t, value)
    else:
        with torch.no_grad():
            t.copy_(storage.from_array(value, t.dtype).cpu())


def _done(result) -> dist.Work:
    # XLA runs the collective asynchronously; its outputs are futures inside the tensors' buffers, so
    # later ops (and .cpu()) wait for them in order, as a CUDA stream would. The Work is complete.
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class TPUProcessGroup(dist.ProcessGroup):
    """c10d process group whose collectives are XLA collectives between processes."""

    def __init__(self, rank: int, size: int, global_ranks: list[int], store: dist.Store):
        super().__init__(rank, size)
        self._name = self._desc = ""
        self._group = collectives.Group(global_ranks)
        self._store, self._calls = store, 0  # the group's c10d store (a PrefixStore of its own): signatures
        if self._group.rank != rank:
            raise RuntimeError(f"tpu: c10d rank {rank} is JAX process {jax.process_index()}; launch with RANK equal "
                               "to the process index (torchrun does)")

    def getBackendName(self) -> str:
        return BACKEND

    def name(self) -> str:
        return BACKEND

    # torch keeps a group's name on its C++ backends, which a Python process group has none of
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    # ------------------------------------------------------------ the signature pre-check
    def _check(self, kind: str, t: torch.Tensor | None, arg: int = 0, shape=None) -> None:
        if not check_collectives or self.size() == 1:
            return
        shape = tuple(t.shape if shape is None else shape) if t is not None else ()
        dims = list(shape[:_MAX_DIMS - 1]) + ([int(np.prod(shape[_MAX_DIMS - 1:]))] if len(shape) >= _MAX_DIMS else [])
        dtype = _DTYPES.index(t.dtype) if t is not None and t.dtype in _DTYPES else -1
        sig = np.full(4 + _MAX_DIMS, -1, np.int64)
        sig[:4] = (_KINDS.index(kind), arg, dtype, len(shape))
        sig[4:4 + len(dims)] = dims
        rows = self._exchange(sig)
        if (rows == rows[0]).all():
            return
        described = "; ".join(f"rank {r}: {_describe(row)}" for r, row in enumerate(rows))
        raise RuntimeError(f"tpu process group: ranks issued mismatched collectives ({described}); every rank "
                           "must issue the same collectives with the same shapes and dtypes")

    def _exchange(self, sig: np.ndarray) -> np.ndarray:
        """Every rank's ``sig`` (rows in rank order; every rank's has the same length), for host-side
        metadata (signatures, all-to-all split sizes). Through the store: the host does not wait for the
        device (a device all-gather read back waited for every op queued before it, and cost an XLA
        collective of its own: 2-3 ms each on XLA:CPU under load). Each rank deletes its previous key
        once every rank has written the next one (so every rank has read the previous ones)."""
        self._calls += 1
        call, me = self._calls, self.rank()
        self._store.set(f"tpu_sig/{call}/{me}", sig.tobytes())
        rows = self._store.multi_get([f"tpu_sig/{call}/{r}" for r in range(self.size())])
        if call > 1:
            self._store.delete_key(f"tpu_sig/{call - 1}/{me}")
        return np.stack([np.frombuffer(row, dtype=sig.dtype) for row in rows])

    # ------------------------------------------------------------ collectives
    def allreduce(self, tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            self._check("all_reduce", t, _REDUCE_CODES[op])
            _store(t, self._group.all_reduce(_read(t), op))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op = _op_name(opts.reduceOp)
        for t in tensors:
            self._check("reduce", t, _REDUCE_CODES[op] * 1000 + opts.rootRank)
            out = self._group.all_reduce(_read(t), op)
            if self.rank() == opts.rootRank:
                _store(t, out)
        return _done(tensors)

    def broadcast(self, tensors, opts):
        for t in tensors:
            self._check("broadcast", t, opts.rootRank)
            _store(t, self._group.broadcast(_read(t), opts.rootRank))
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(f"all_gather: tensor list has {len(outs)} entries, the group has {self.size()} ranks")
            self._check("all_gather", t)
            gathered = self._group.all_gather(_read(t))
            for i, o in enumerate(outs):
                _check_numel(o, t, "all_gather")
                _store(o, gathered[i].reshape(o.shape))
        return _done(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, expected "
                             f"{input.numel()} x {self.size()} ranks")
        self._check("all_gather", input)
        _store(output, self._group.all_gather(_read(input)).reshape(output.shape))
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    def gather(self, output_tensors, input_tensors, opts):
        for outs, t in zip(output_tensors or [[]] * len(input_tensors), input_tensors):
            self._check("gather", t, opts.rootRank)
            gathered = self._group.all_gather(_read(t))
            if self.rank() == opts.rootRank:
                for i, o in enumerate(outs):
                    _store(o, gathered[i].reshape(o.shape))
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements, expected "
                             f"{output.numel()} x {self.size()} ranks")
        self._check("reduce_scatter", input, _REDUCE_CODES[op])
        chunks = _read(input).reshape(self.size(), *output.shape)
        _store(output, self._group.reduce_scatter(chunks, op))
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for out, ins in zip(output_tensors, input_tensors):
            self._check("reduce_scatter", out, _REDUCE_CODES[op])
            stacked = jnp.stack([_read(i).reshape(out.shape) for i in ins])
            _store(out, self._group.reduce_scatter(stacked, op))
        return _done(output_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        even = [input.shape[0] // n] * n
        if list(output_split_sizes) not in ([], even) or list(input_split_sizes) not in ([], even):
            return self._alltoall_uneven(output, input, list(output_split_sizes), list(input_split_sizes))
        if input.shape[0] % n or output.shape != input.shape:
            raise ValueError(f"all_to_all_single: dim 0 of the input ({input.shape[0]}) must divide into the "
                             f"{n} ranks and the output must have the input's shape")
        self._check("all_to_all", input)
        chunks = _read(input).reshape(n, input.shape[0] // n, *input.shape[1:])
        _store(output, self._group.all_to_all(chunks).reshape(output.shape))
        return _done([output])

    def _alltoall_uneven(self, output, input, out_splits, in_splits):
        # XLA's all-to-all moves equal blocks: pad every block to the largest split any rank sends.
        n, rest = self.size(), tuple(input.shape[1:])
        in_splits = in_splits or [input.shape[0] // n] * n
        out_splits = out_splits or [output.shape[0] // n] * n
        sizes = self._exchange(np.asarray(in_splits, np.int64))  # [src, dst], through the store as signatures
        if sizes[:, self.rank()].tolist() != out_splits:
            raise ValueError(f"all_to_all_single: rank {self.rank()} expects {out_splits} rows but the ranks send "
                             f"{sizes[:, self.rank()].tolist()}")
        block = int(sizes.max())
        self._check("all_to_all", None, block)
        x, offsets = _read(input), np.cumsum([0] + in_splits)
        padded = jnp.stack([jnp.pad(x[offsets[i]:offsets[i + 1]], [(0, block - in_splits[i])] + [(0, 0)] * len(rest))
                            for i in range(n)])
        got = self._group.all_to_all(padded)
        _store(output, jnp.concatenate([got[i, :out_splits[i]] for i in range(n)]))
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        for o, i in zip(output_tensors, input_tensors):
            _check_numel(o, i, "all_to_all")
        self._check("all_to_all", input_tensors[0])
        got = self._group.all_to_all(jnp.stack([_read(i).reshape(-1) for i in input_tensors]))
        for k, o in enumerate(output_tensors):
            _store(o, got[k].reshape(o.shape))
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        root = opts.rootRank
        for k, out in enumerate(output_tensors):
            self._check("scatter", out, root)
            if self.rank() == root:
                stacked = jnp.stack([_read(i).reshape(out.shape) for i in input_tensors[k]])
            else:
                stacked = jnp.zeros((self.size(), *out.shape), _read(out).dtype)
            _store(out, self._group.scatter(stacked, root))
        return _done(output_tensors)

    def barrier(self, opts=None):
        self._check("barrier", None)
        self._group.all_reduce(jnp.zeros((1,), jnp.int32), "sum").block_until_ready()
        return _done(None)

    def send(self, tensors, dst, tag=0):
        for t in tensors:
            self._group.send_recv(_read(t), self.rank(), dst).block_until_ready()
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        for t in tensors:
            _store(t, self._group.send_recv(_read(t), src, self.rank()))
        return _done(tensors)

    # torch >= 2.13 names of the same collectives (called from Python; C++ reaches the names above)
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("tpu process group: recv without a source rank is not supported: an XLA "
                           "point-to-point transfer is one program that sender and receiver both run, so "
                           "the receiver must name the sender (dist.recv(t, src=...))")


_REDUCE_CODES = {name: i for i, name in enumerate(collectives.REDUCTIONS)}


def _describe(row) -> str:
    kind = _KINDS[row[0]] if 0 <= row[0] < len(_KINDS) else "?"
    if kind == "compiled_graph":  # arg: a hash of the program's collectives (compiler/collectives.py)
        return f"a compiled graph whose collectives hash to {int(row[1]):08x}"
    dtype = str(_DTYPES[row[2]]).replace("torch.", "") if 0 <= row[2] < len(_DTYPES) else ""
    dims = [int(d) for d in row[4:4 + min(int(row[3]), _MAX_DIMS)]]
    return f"{kind} {dtype}{dims if row[3] >= 0 else ''} (arg {int(row[1])})"


def _check_numel(out: torch.Tensor, inp: torch.Tensor, what: str) -> None:
    if out.numel() != inp.numel():
        raise ValueError(f"{what}: output tensor has {out.numel()} elements, input has {inp.numel()}")


def _create(backend_opts, pg_options) -> TPUProcessGroup:
    refused = jax_runtime.refusal()
    if refused:
        raise RuntimeError(refused)
    size = backend_opts.group_size
    ranks = list(backend_opts.global_ranks_in_group) or list(range(size))
    if not jax_runtime.joined() and jax.process_count() < max(ranks) + 1:
        raise RuntimeError(
            f"tpu process group of {size} processes, but this process is not part of JAX's multi-process runtime. "
            "Start the processes with torchrun (or tpu_interactive.launch): tpu_interactive joins the runtime on "
            "import from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, so they must be set before `import tpu_interactive`")
    return TPUProcessGroup(backend_opts.group_rank, size, ranks, backend_opts.store)


def register() -> None:
    """Register the ``tpu`` c10d backend (the default for tpu devices, like nccl for cuda), also under
    ``tpu_dist``, the name Transformers asks for on tpu (TorchTPU's backend name)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(ALIAS, _create, extended_api=True, devices=["tpu"])
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["tpu"])  # last: the default
