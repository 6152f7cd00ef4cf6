"""The warm eager path: a repeated eager op call runs from C++ (csrc/fast_dispatch.cpp and its fronts).

Python bookkeeping, not XLA, was most of a small eager op's cost (an ``a + b`` of 128 floats: ~29 µs
against ~6 µs for raw ``jax.numpy``). Each functional and in-place kernel is a C++ callable that keys
the call by everything that decides its program and its output metadata (the op; each tensor's
device, dtype, shape and, for a view, its geometry in its buffer; the other arguments by value, or
floats by type where they cannot change the output metadata; for an in-place op, which tensors
alias self; the Pallas switch) and, on a key seen before, runs the recorded **plan**: the op's
jitted program (planned.py) on the buffers' arrays, the outputs wrapped as fresh tpu tensors (or
self's buffer given its new array), the op counters kept. torch calls that callable's C++ front end on
its own IValues (csrc/boxed_front.cpp, registered by installation.py): a call a plan serves makes no
Python objects; any other gets Python arguments as a Python kernel would and calls the callable.

A miss hands the key to the Python kernel, which runs as before (torch's meta kernel, its checks
and errors) with the lowering run as that same jitted program; :func:`offer` then records the plan.
Tensors whose buffer holds no array, views inside tensor lists, subclasses and unknown argument
types take the Python path; sync mode and the NaN check switch the C++ path off (:func:`refresh`).
While fused mode records, keys are its own and plans are *record plans*: a hit records the call
into the segment (``fusion.Recorder``, or its C++ twin csrc/fused_record.cpp for the usual call)
instead of running it, with the same key and the same skipped Python as a run plan. Without the C++
extension nothing here runs.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from . import errors, fusion, memory_history, op_jit, stats, storage, unrecorded
from .config import add_listener, config
from .stats import STATS, record_kernel_path

_native: Any = None  # the C++ module, once installed
_FLOATS_BY_VALUE: set[int] = set()  # ops (C++ op ids) whose floats are keyed by value (see offer)
_FLOAT_INPUT_OPS: set[int] = set()  # ops with a plan taking a float as a program input
# (lowering, op id, key) of the call whose Python kernel is running: the plan it may offer
PENDING: list = [None]
_NATIVE_RECORDER = [False]  # a record plan calls fusion.Recorder's C++ twin (csrc/fused_record.cpp)


def install(module: Any) -> None:
    """Hand the C++ half what it calls (the storage maker, the op counters) and switch it on; kernels
    made from now on (:func:`front`) take the fast path."""
    global _native
    stats.count_natively(module)  # the outputs made here are counted in C++, with every other buffer
    module.fast_configure(op_jit.ARRAY, storage._device_storage, storage.DeviceBuffer, vars(memory_history),
                          storage.reserve(0), STATS.op_counts, STATS.op_seconds, record_kernel_path,
                          op_jit._device_scalar, [torch.dtype, torch.layout, torch.memory_format], fusion.Lazy,
                          fusion.note_write)
    storage.set_reserve(module.fast_reserve)  # one address counter for both halves
    stats.folds.append(module.fast_fold_counts)  # the plans' calls, counted in C++ until a read
    _NATIVE_RECORDER[0] = module.fused_configure(fusion.Lazy, fusion._current, fusion.flush, errors.is_internal)
    _native = module
    add_listener(refresh)
    unrecorded.on_change.append(refresh)
    refresh()


def refresh() -> None:
    """Tell the C++ half whether it may run, whether it records (fused mode: record plans), which
    Pallas setting selects programs, and whether storages must be made in Python (a memory limit is
    checked there)."""
    if _native is not None:
        recording = config.fuse and not unrecorded.running()
        _native.fast_set(not (config.sync or config.nan_check), int(bool(config.pallas)),
                         config.memory_limit_bytes is not None, bool(recording))
        _native.fused_limits(config.fuse_max_ops, config.fuse_max_depth)


def plans() -> int:
    """How many plans are recorded."""
    return _native.fast_plans() if _native is not None else 0


def front(kernel: Callable, token: Any, op_name: str, inplace: bool = False, floats_by_type: bool = False,
          list_views: bool = False) -> Callable:
    """``kernel`` behind the C++ fast path (a hit returns from C++; a miss runs ``kernel`` with
    (``token``, op id, key) in :data:`PENDING`, for :func:`offer`); ``kernel`` itself without the
    extension. ``inplace``: an in-place op, whose plan writes its first argument's buffer.
    ``floats_by_type``: Python floats never change the op's output metadata (``meta_by_type``), so
    they are keyed by type and handed to the program as device scalars. ``list_views``: a list's
    tensors may be views (keyed by their geometry; the plan is handed their buffers' arrays), except
    an in-place op's written list."""
    if _native is None:
        return kernel
    return _native.fast_kernel(op_name, kernel, token, PENDING, inplace, floats_by_type, list_views)


def take(token: Any) -> tuple | None:
    """The pending (op id, key) if the running kernel is the one fronted with ``token`` (consumed)."""
    pending = PENDING[0]
    if pending is None or pending[0] is not token:
        return None
    PENDING[0] = None
    return pending[1], pending[2]


def offer(pending: tuple, torch_call: tuple, jax_call: tuple, program: Callable, inputs: list,
          floats_are_inputs: bool, outputs: Any, kernel_path: str | None, inplace: bool = False,
          floats_by_type: bool = False, written: int = 1, recording: bool = False) -> None:
    """Record the plan of a call that ran ``program(*inputs)``. ``torch_call`` is the kernel's
    (args, kwargs), ``jax_call`` what the program was called with (arrays for tensors; device
    scalars for Python numbers that are values), walked together in the C++ half's slot order:
    an input from a tpu tensor is read from its slot on every call; any other input (a cpu scalar,
    a Python number) is a constant of the plan (the key holds its value). ``outputs``: torch's output
    metadata (for ``inplace``, the buffer's shape and dtype: the program's result is its new array).
    An in-place plan also gets the program donating self's buffer's array, which the C++ half calls
    when nothing else holds that array: XLA then updates the buffer in place, so writing a slice of a
    large buffer, or scattering rows into a KV cache, costs the part written, not a copy of it all.
    An in-place foreach op writes the ``written`` tensors of its first list (``outputs``: a tuple of
    their metadata), which are the program's first inputs and its results.
    ``recording``: a plan of fused mode, whose ``program`` is a ``fusion.Recorder``: a hit records the
    call into the segment (Lazy results; an in-place write is noted for the segment's undo)."""
    (args, kwargs), (jargs, jkwargs) = torch_call, jax_call
    if len(args) != len(jargs) or list(kwargs) != list(jkwargs)[: len(kwargs)]:
        return
    op_id, key = pending
    if floats_by_type and op_id in _FLOATS_BY_VALUE:
        floats_by_type = False
    slots: list[int] = []
    constants: list = []
    position = 0
    it = iter(inputs)
    try:
        for value, jvalue in zip((*args, *kwargs.values()), (*jargs, *(jkwargs[k] for k in kwargs))):
            sequence = type(value) is list or type(value) is tuple
            if sequence and not (type(jvalue) is list or type(jvalue) is tuple) or sequence and len(value) != len(jvalue):
                return
            for item, jitem in zip(value, jvalue) if sequence else ((value, jvalue),):
                if type(item) is float and floats_by_type:  # the C++ half puts its device scalar there
                    if not floats_are_inputs:  # the program bakes floats in (pow's exponent 3.0 picks
                        # x * x * x): a plan keyed by type would be wrong, so the op's keys take float
                        # values from now on (plans from its next call; it had none), unless its other
                        # calls have plans taking floats as inputs (a new lr each step: no new plan)
                        if op_id not in _FLOAT_INPUT_OPS:
                            _FLOATS_BY_VALUE.add(op_id)
                            _native.fast_floats_by_value(op_id)
                        return
                    _FLOAT_INPUT_OPS.add(op_id)
                    next(it)
                    slots.append(position)
                    constants.append(None)
                elif type(jitem) in op_jit.DYNAMIC_TYPES or (type(jitem) is float and floats_are_inputs):
                    array = next(it)
                    on_device = isinstance(item, torch.Tensor) and item.device.type == "tpu"
                    slots.append(position if on_device else -1)
                    constants.append(None if on_device else array)
                position += 1
    except StopIteration:
        return
    if next(it, None) is not None:
        return
    results = outputs if isinstance(outputs, tuple) else (outputs,)
    specs = [s for s in results if hasattr(s, "shape") and hasattr(s, "dtype")]
    # a tuple may hold undefined tensors (None) and ints (max_q): the values the key always gives them
    fixed = [(i, s) for i, s in enumerate(results) if s is None or type(s) is int]
    if not specs or len(specs) + len(fixed) != len(results) or fixed and (
            inplace or results is not outputs or not _program_leaves_none(program, recording, fixed)):
        return  # other outputs (a nested list, a float): the Python path wraps those
    donating = None
    if recording and _NATIVE_RECORDER[0]:
        program = _native.fused_recorder(program)
    if not recording:  # the executables the call ran (or that run on first use), not the jit
        donate = written if inplace and slots[:written] == list(range(written)) else 0
        program, donating = op_jit.plan_executables(program, inputs, donate)
    _native.fast_put(op_id, key, program, slots, constants, [list(s.shape) for s in specs],
                     [s.dtype for s in specs], not isinstance(outputs, tuple), kernel_path, inplace, donating,
                     recording, fixed, len(results))


def _program_leaves_none(program: Any, recording: bool, fixed: list) -> bool:
    """Whether the program's result is None at each fixed position. Where torch's meta kernel gives no
    tensor, a lowering may still return an array (the Python path then wraps it as it is), and a plan
    would return None there."""
    try:  # a record plan's step knows its result tree; a run plan's op_jit.Program, the executable it just ran
        tree = program.step.treedef if recording else program.last[2].out_tree
        children = tree.children()
    except AttributeError:  # a program run as a jit (inputs not concrete arrays): no plan, as before
        return False
    return all(i < len(children) and children[i].num_leaves == 0 for i, _ in fixed)


def donations() -> int:
    """In-place op calls from C++ plans that donated self's buffer's array (updated it in place)."""
    return _native.fast_donations() if _native is not None else 0


def recorded() -> int:
    """Op calls recorded into a fused segment from C++ record plans (no Python dispatch)."""
    return _native.fast_recorded() if _native is not None else 0


def recorded_in_cpp() -> int:
    """Of those, the calls recorded without the Python recorder (csrc/fused_record.cpp)."""
    return _native.fused_recorded_here() if _native is not None else 0
