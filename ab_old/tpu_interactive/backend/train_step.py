"""``tpu_interactive.compile_train_step``: forward + loss + backward + optimizer update as ONE program.

``torch.compile(model)`` gives a forward graph and a backward graph, and the optimizer runs as a
third; between them torch's runtime (dynamo guards, aot_autograd wrappers, the autograd engine)
runs in Python on every step. A hand-written JAX training step is a single ``jax.jit`` program.
This module builds the same thing from unmodified PyTorch code:

1. The first call runs eagerly: the optimizer creates its state (momentum, Adam moments) its own way.
2. ``make_fx`` traces ``torch.func.grad_and_value`` of ``loss_fn(model, *batch)`` followed by the
   real ``optimizer.step()`` (pointed at the traced parameters and gradients), functionalized: one aten
   graph whose inputs are parameters, buffers, optimizer state and the batch, and which ends by
   writing the new parameters / state / buffers back into those inputs.
3. That graph runs as one ``CompiledGraph`` (the same lowerings and compile cache as
   ``torch.compile(backend="tpu")``); the new values are stored straight into the parameters'
   device buffers. Per step, Python does one jitted call.

Guards: the batch's shapes/dtypes, every module's train/eval flag, the optimizer's hyperparameters
(``lr``, ``betas``...) and the layout of its state. A change re-traces and is reported as a
recompile with its cause, like any other compile.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
from typing import Any, Callable

import torch

from . import compiler as tcompile

_counter = itertools.count()


def _hashable(value: Any):
    if isinstance(value, torch.Tensor):  # a program input (lr=torch.tensor(...)): its value is not baked in
        return ("<tensor>", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


@contextlib.contextmanager
def _optimizer_over(optimizer: torch.optim.Optimizer, params: dict, grads: dict, state: dict):
    """Point ``optimizer`` at traced stand-ins: params[id(real)] / grads / state[id(real)]."""
    saved_params = [group["params"] for group in optimizer.param_groups]
    saved_state = optimizer.state
    fresh = collections.defaultdict(dict)
    try:
        for group in optimizer.param_groups:
            group["params"] = [params[id(p)] for p in group["params"]]
        for real_id, proxy in params.items():
            proxy.grad = grads[real_id]
            if state.get(real_id):
                fresh[proxy] = state[real_id]
        optimizer.state = fresh
        yield
    finally:
        for group, original in zip(optimizer.param_groups, saved_params):
            group["params"] = original
        optimizer.state = saved_state


def _drop_profiler_nodes(gm: torch.fx.GraphModule) -> None:
    """optimizer.step() opens a profiler record_function; it has no meaning inside a jitted program."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"
             and getattr(n.target, "namespace", None) == "profiler"]
    for node in reversed(nodes):  # the exit nodes (users of the handles) first
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()


class CompiledTrainStep:
    """``step(*batch) -> loss``: one optimizer step of ``loss_fn(model, *batch)`` as one jitted program.

    Parameters, buffers and optimizer state are updated in place, as ``loss.backward(); opt.step()``
    would; ``.grad`` is not filled (the gradients live inside the program, as in a jitted JAX step).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                 optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None):
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.max_grad_norm = max_grad_norm
        self.name = f"train_step{next(_counter)}"
        self._graphs: dict = {}
        self._last_guards = None
        self._started = False
        self._made_capturable: set[int] = set()
        self._hooked = False
        self._param_names = {id(p): n for n, p in model.named_parameters()}

    @property
    def compile_label(self) -> str:  # names this step's XLA compiles in compile_log
        return f"compile_train_step {self.name}"

    # -- the pieces of one call
    def _opt_params(self) -> list:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _state_layout(self, opt_params) -> tuple:
        state = self.optimizer.state
        return tuple(tuple(sorted((k, "<tensor>" if isinstance(v, torch.Tensor) else _hashable(v))
                                  for k, v in state.get(p, {}).items())) for p in opt_params)

    def _guards(self, batch, opt_params) -> tuple:
        batch_sig = tuple((tuple(b.shape), b.dtype, b.device.type) if isinstance(b, torch.Tensor)
                          else ("static", _hashable(b)) for b in batch)
        modes = tuple(m.training for m in self.model.modules())
        hyper = tuple(tuple(sorted((k, _hashable(v)) for k, v in g.items() if k != "params"))
                      for g in self.optimizer.param_groups)
        return batch_sig, modes, hyper, self._state_layout(opt_params)

    def _why(self, guards) -> str:
        last = self._last_guards
        if last is None:
            return "first compile"
        labels = ("batch shapes/dtypes", "module train/eval modes", "optimizer hyperparameters",
                  "optimizer state layout")
        changed = [label for label, old, new in zip(labels, last, guards) if old != new]
        if changed == ["optimizer hyperparameters"]:
            diffs = [f"param_groups[{i}].{k}: {dict(o).get(k)!r} -> {v!r}"
                     for i, (o, n) in enumerate(zip(last[2], guards[2])) for k, v in n if dict(o).get(k) != v]
            return "optimizer " + "; ".join(diffs)
        return "changed: " + ", ".join(changed)

    def _prepare_optimizer(self) -> None:
        """Capturable mode (as torch.compile does for device optimizers): Adam-family step counters
        live on the device, so the update needs no host value and traces into the program. Checked on
        every call: ``optimizer.load_state_dict`` brings back the saved (non-capturable) setting."""
        for index, group in enumerate(self.optimizer.param_groups):
            if "capturable" in group and not group["capturable"] and all(
                    p.device.type == "tpu" for p in group["params"]):
                group["capturable"] = True
                self._made_capturable.add(index)
                for p in group["params"]:
                    st = self.optimizer.state.get(p, {})
                    if isinstance(st.get("step"), torch.Tensor) and st["step"].device != p.device:
                        st["step"] = st["step"].to(p.device)
        if self._made_capturable and not self._hooked:
            self.optimizer.register_state_dict_post_hook(self._checkpoint_as_eager)
            self._hooked = True

    def _checkpoint_as_eager(self, optimizer, state_dict: dict) -> dict:
        """``optimizer.state_dict()`` as the eager optimizer would save it (capturable off, step counters
        on the host), so a checkpoint loads anywhere, a CPU optimizer included."""
        for index in self._made_capturable:
            group = state_dict["param_groups"][index]
            group["capturable"] = False
            for key in group["params"]:
                st = state_dict["state"].get(key)
                if st and isinstance(st.get("step"), torch.Tensor) and st["step"].device.type != "cpu":
                    state_dict["state"][key] = {**st, "step": st["step"].cpu()}  # a copy: live state stays
        return state_dict

    def _eager_step(self, batch) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model, *batch)
        loss.backward()
        self._clip(self._opt_params())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def _clip(self, params) -> None:
        """torch's own clip_grad_norm_ (2-norm over all gradients), on the real or the traced tensors."""
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)

    def _trace(self, opt_params, batch) -> tcompile.CompiledGraph:
        from torch.func import functionalize, grad_and_value
        from torch.fx.experimental.proxy_tensor import make_fx

        model, optimizer = self.model, self.optimizer
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
        buffers = list(model.named_buffers())
        state_entries = [(p, k) for p in opt_params for k, v in optimizer.state.get(p, {}).items()
                         if isinstance(v, torch.Tensor)]
        groups = optimizer.param_groups
        # tensor hyperparameters (lr=torch.tensor(...), which LR schedulers update in place with
        # fill_) are inputs of the program: a schedule then runs without recompiling
        hyper_entries = [(i, k) for i, g in enumerate(groups) for k, v in g.items()
                         if k != "params" and isinstance(v, torch.Tensor)]
        batch_slots = [i for i, b in enumerate(batch) if isinstance(b, torch.Tensor)]
        trainable_ids = {id(p) for _, p in trainable}
        missing = [p for p in opt_params if id(p) not in trainable_ids]
        if missing:
            raise ValueError("compile_train_step: the optimizer holds tensors that are not trainable "
                             f"parameters of the model (shapes {[tuple(p.shape) for p in missing]})")

        def whole(train_vals, frozen_vals, buffer_vals, state_vals, hyper_vals, batch_vals):
            fixed = {n: v for (n, _), v in zip(frozen, frozen_vals)}
            fixed.update({n: v for (n, _), v in zip(buffers, buffer_vals)})
            args = list(batch)
            for slot, value in zip(batch_slots, batch_vals):
                args[slot] = value

            def loss_of(train, fixed):
                # the module runs on the traced values (tied weights stay tied); buffers are an input
                # of the transformed function, so BatchNorm may update its running stats in place
                with _module_as(model, {**train, **fixed}):
                    return self.loss_fn(model, *args)

            grads, loss = grad_and_value(loss_of)({n: v for (n, _), v in zip(trainable, train_vals)}, fixed)
            by_id = {id(p): v for (_, p), v in zip(trainable, train_vals)}
            grad_by_id = {id(p): grads[n] for n, p in trainable}
            states: dict = {}
            values = iter(state_vals)
            for p in opt_params:
                st = optimizer.state.get(p)
                if st:
                    states[id(p)] = {k: next(values) if isinstance(v, torch.Tensor) else v for k, v in st.items()}
            saved_hyper = [groups[i][k] for i, k in hyper_entries]
            # fused=True groups trace their foreach form (the same update; the whole step is one program
            # anyway): torch's C++ functionalization of _fused_adam_ rejects the empty max_exp_avg_sqs list
            fused = [g for g in groups if g.get("fused")]
            try:
                for g in fused:
                    g["fused"] = False
                for (i, k), value in zip(hyper_entries, hyper_vals):
                    groups[i][k] = value
                with _optimizer_over(optimizer, {i: by_id[i] for i in map(id, opt_params)}, grad_by_id, states):
                    self._clip([by_id[id(p)] for p in opt_params])
                    optimizer.step()
            finally:
                for (i, k), value in zip(hyper_entries, saved_hyper):
                    groups[i][k] = value
                for g in fused:
                    g["fused"] = True
            return loss

        example = ([p.detach() for _, p in trainable], [p.detach() for _, p in frozen],
                   [b for _, b in buffers], [optimizer.state[p][k] for p, k in state_entries],
                   [groups[i][k] for i, k in hyper_entries], [batch[i] for i in batch_slots])
        gm = make_fx(functionalize(whole, remove="mutations"), tracing_mode="fake",
                     decomposition_table=tcompile.decompositions())(*example)
        _drop_profiler_nodes(gm)
        if any(n.target is torch.ops.aten._local_scalar_dense.default for n in gm.graph.nodes):
            raise NotImplementedError(
                "compile_train_step: the step reads a tensor's value on the host (.item() / float(t): "
                "aten::_local_scalar_dense), which cannot be part of one compiled program. "
                f"{type(optimizer).__name__} does this with a tensor lr: use a float lr there (a changed lr "
                "recompiles); Adam and AdamW take lr=torch.tensor(...) as a program input.")
        names = ([f"model.{n}" for n, _ in trainable] + [f"model.{n}" for n, _ in frozen]
                 + [f"model.{n}" for n, _ in buffers]
                 + [f"optimizer.state[{self._param_names.get(id(p), '?')}].{k}" for p, k in state_entries]
                 + [f"optimizer.param_groups[{i}].{k}" for i, k in hyper_entries]
                 + [f"batch[{i}]" for i in batch_slots])
        graph = tcompile.CompiledGraph(gm, ("train_step", self.name), self.name, names)
        graph.inputs_of = lambda b: ([p for _, p in trainable] + [p for _, p in frozen] + [x for _, x in buffers]
                                     + [optimizer.state[p][k] for p, k in state_entries]
                                     + [optimizer.param_groups[i][k] for i, k in hyper_entries]
                                     + [b[i] for i in batch_slots])
        return graph

    def __call__(self, *batch) -> torch.Tensor:
        self._prepare_optimizer()
        if not self._started:
            loss = self._eager_step(batch)  # creates the optimizer state; the next call compiles
            self._started = True
            return loss
        opt_params = self._opt_params()
        guards = self._guards(batch, opt_params)
        graph = self._graphs.get(guards)
        if graph is None:
            graph = self._trace(opt_params, batch)
            graph.cause_override = self._why(guards)
            self._graphs[guards] = graph
        self._last_guards = guards
        with torch.no_grad():
            (loss,) = graph(graph.inputs_of(batch))
        return loss


def _module_as(model: torch.nn.Module, values: dict):
    """The context manager inside ``torch.func.functional_call``: the loss function calls the module
    itself, so the module must run on the traced values for the duration of that call."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(model, values, tie_weights=True)


def compile_train_step(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor],
                       optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None
                       ) -> CompiledTrainStep:
    """One training step (forward, ``loss_fn(model, *batch)``, backward, optionally
    ``clip_grad_norm_(max_grad_norm)``, ``optimizer.step()``) as one jitted program:
    ``step = compile_train_step(model, loss_fn, opt); loss = step(x, y)``."""
    return CompiledTrainStep(model, loss_fn, optimizer, max_grad_norm)
