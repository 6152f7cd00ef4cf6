"""Eager tpu vs torch.compile(backend="tpu") vs a hand-written jax.jit equivalent, in one run.

    python benchmarks/compiled.py [--iters N] [--small]

Workloads: an MLP and a small pre-LN transformer block, each forward-only and a full training step
(forward + MSE loss + backward + SGD update). Training columns:
- 'compiled': tt.compile(model): a forward and a backward graph; loss and SGD update run eagerly;
- '+opt': the optimizer step compiled too (tt.compile(opt.step)): three graphs per step, with
  torch's runtime (dynamo guards, aot_autograd wrappers, the autograd engine) in between;
- 'step': tt.compile_train_step(model, loss_fn, opt): the whole step as ONE jitted program, like
- 'fused': plain eager code in fused eager mode (tt.fuse()), one segment per step (flushed at its end);
- 'pure jax': a hand-written jax.jit of value_and_grad + the update.
Printed: ms per iteration and speed relative to pure JAX (1.00 = as fast).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tpu_interactive as tt  # noqa: E402

DEV = tt.device()
HI = jax.lax.Precision.HIGHEST  # the eager lowerings use HIGHEST too: same arithmetic


# ---------------------------------------------------------------- models (torch)
def make_mlp(d_in, hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


# ---------------------------------------------------------------- the same models in pure JAX
def jax_params(model):
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}


def linear(p, name, x):
    return jnp.matmul(x, p[name + ".weight"].T, precision=HI) + p[name + ".bias"]


def jax_mlp(p, x):
    x = jax.nn.relu(linear(p, "0", x))
    x = jax.nn.relu(linear(p, "2", x))
    return linear(p, "4", x)


def layer_norm(p, name, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = jnp.square(x - mu).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def jax_block(p, x, heads):
    b, t, d = x.shape
    q, k, v = jnp.split(linear(p, "qkv", layer_norm(p, "ln1", x)), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=HI) / math.sqrt(d // heads)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v, precision=HI)
    x = x + linear(p, "proj", a.transpose(0, 2, 1, 3).reshape(b, t, d))
    return x + linear(p, "fc2", jax.nn.gelu(linear(p, "fc1", layer_norm(p, "ln2", x)), approximate=False))


# ---------------------------------------------------------------- timing
REPEATS = 5


def timeit(fn, iters, sync):
    """Median over REPEATS runs of ``iters`` calls (the 2-core CI-class machine is noisy)."""
    for _ in range(3):  # warm-up: compiles and first-call costs are not timed
        sync(fn())
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(iters):
            out = fn()
        sync(out)
        runs.append((time.perf_counter() - start) / iters * 1e3)
    return sorted(runs)[len(runs) // 2]


def torch_sync(out):
    tt.synchronize()
    return out


def jax_sync(out):
    return jax.block_until_ready(out)


def run_workload(name, model, x, target, jax_fwd, iters):
    lr = 1e-3
    dev_model = model.to(DEV)
    xd, td = x.to(DEV), target.to(DEV)
    compiled = tt.compile(dev_model)
    params = {k: v for k, v in jax_params(dev_model).items()}
    xj, tj = jnp.asarray(x.numpy()), jnp.asarray(target.numpy())

    def torch_train(m, compile_optimizer=False, fused=False):
        opt = torch.optim.SGD(dev_model.parameters(), lr=lr)
        update = tt.compile(opt.step) if compile_optimizer else opt.step

        def step():
            with tt.fuse(fused):  # leaving the block runs the step's segment (without waiting for it)
                opt.zero_grad(set_to_none=True)
                loss = F.mse_loss(m(xd), td)
                loss.backward()
                update()
            return loss
        return step

    def jax_loss(p, x, t):
        return jnp.mean(jnp.square(jax_fwd(p, x) - t))

    @jax.jit
    def jax_step(p, x, t):
        loss, grads = jax.value_and_grad(jax_loss)(p, x, t)
        return jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grads), loss

    state = {"p": params}

    def jax_train():
        state["p"], loss = jax_step(state["p"], xj, tj)
        return loss

    fwd_jit = jax.jit(jax_fwd)
    rows = []
    with torch.no_grad():
        eager = timeit(lambda: dev_model(xd), iters, torch_sync)
        comp = timeit(lambda: compiled(xd), iters, torch_sync)
    pure = timeit(lambda: fwd_jit(params, xj), iters, jax_sync)
    rows.append((f"{name} forward", eager, comp, None, None, None, pure))
    eager = timeit(torch_train(dev_model), iters, torch_sync)
    fused = timeit(torch_train(dev_model, fused=True), iters, torch_sync)
    comp = timeit(torch_train(compiled), iters, torch_sync)
    comp_opt = timeit(torch_train(compiled, compile_optimizer=True), iters, torch_sync)
    whole = tt.compile_train_step(dev_model, lambda m, x, t: F.mse_loss(m(x), t),
                                  torch.optim.SGD(dev_model.parameters(), lr=lr))
    one_program = timeit(lambda: whole(xd, td), iters, torch_sync)
    pure = timeit(jax_train, iters, jax_sync)
    rows.append((f"{name} train step", eager, comp, comp_opt, one_program, fused, pure))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=10, help="calls per timed run (median of 5 runs)")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run)")
    parser.add_argument("--large", action="store_true", help="accelerator-sized shapes (a TPU/GPU run)")
    args = parser.parse_args()
    torch.manual_seed(0)
    scale = 4 if args.small else 1
    b, d_in, hidden = 256 // scale, 512 // scale, 1024 // scale
    bt, t, d, heads = 8 // (2 if args.small else 1), 64 // scale, 128 // scale, 4
    if args.large:
        b, d_in, hidden = 4096, 2048, 8192
        bt, t, d, heads = 16, 512, 1024, 16
    mlp = make_mlp(d_in, hidden, 16)
    block = Block(d, heads)
    rows = run_workload("MLP", mlp, torch.randn(b, d_in), torch.randn(b, 16), jax_mlp, args.iters)
    rows += run_workload("transformer block", block, torch.randn(bt, t, d), torch.randn(bt, t, d),
                         lambda p, x: jax_block(p, x, heads), args.iters)
    print(f"platform: {jax.default_backend()} ({jax.devices()[0].device_kind}); ms per iteration, "
          f"median of {REPEATS} runs of {args.iters} iterations after warm-up; ratio = pure-JAX time / our time (1.00 = parity)")
    print("'+opt': tt.compile(model) and tt.compile(opt.step); 'step': tt.compile_train_step (one program)")

    def cells(ms, pure):
        return (f"{ms:>10.3f}", f"{pure / ms:>10.2f}") if ms else (f"{'-':>10}", f"{'-':>10}")

    print(f"{'workload':<30}{'eager':>10}{'compiled':>10}{'+opt':>10}{'step':>10}{'fused':>10}{'pure jax':>10}"
          f"{'eager/jax':>11}{'comp/jax':>10}{'+opt/jax':>10}{'step/jax':>10}{'fused/jax':>10}")
    for name, eager, comp, comp_opt, one_program, fused, pure in rows:
        with_opt, step, fuse = cells(comp_opt, pure), cells(one_program, pure), cells(fused, pure)
        print(f"{name:<30}{eager:>10.3f}{comp:>10.3f}{with_opt[0]}{step[0]}{fuse[0]}{pure:>10.3f}{pure / eager:>11.2f}"
              f"{pure / comp:>10.2f}{with_opt[1]}{step[1]}{fuse[1]}")


if __name__ == "__main__":
    main()
