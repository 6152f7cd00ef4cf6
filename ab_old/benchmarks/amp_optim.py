"""Fused optimizer steps and bf16 autocast on tpu, side by side in one run.

    python benchmarks/amp_optim.py [--repeats N] [--iters N]

1. Optimizer step (AdamW, SGD-momentum) over the parameters of a small transformer block
   (~0.8 M parameters in 12 tensors) and of a wide MLP (~4.2 M in 6 tensors): tpu `fused=True`
   (one jitted update per step), tpu `foreach=True` (torch's _foreach_* path: one kernel per tensor
   per op), the tpu CPU-fallback path the fused ops took before (host round trip: measured by
   disabling the lowering), and CPU `fused=True`.
2. Forward+backward of the MLP and the block: float32 vs `torch.autocast("tpu", dtype=bfloat16)`, and
   bf16 autocast in fused eager mode (`tpu_interactive.fuse()`, `loss.item()` each step).
Printed: medians over --repeats runs of ms per step (each run: --iters steps after a warm-up), and
ratios. Device-inclusive: every timed run ends with tt.synchronize().
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import tpu_interactive as tt  # noqa: E402
from tpu_interactive.backend import fallback as tpu_fallback  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def make_mlp():
    return nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10))


def sync(device):
    if torch.device(device).type == "tpu":
        tt.synchronize()


def median_ms(fn, device, repeats, iters):
    for _ in range(3):  # warm-up: compiles (a first SGD step is its own program: no momentum yet)
        fn()
    sync(device)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        runs.append((time.perf_counter() - start) / iters * 1e3)
    return statistics.median(runs)


def optimizer_step(factory, make_opt, device, repeats, iters):
    torch.manual_seed(0)
    model = factory().to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt = make_opt(model.parameters())
    return median_ms(opt.step, device, repeats, iters)


class _FallbackPath:
    """The fused ops routed to the CPU fallback, as before their lowering (for comparison only)."""

    def __enter__(self):
        self.lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": intended
            for name in ("_fused_adamw_", "_fused_sgd_"):
                op = getattr(torch.ops.aten, name).default
                self.lib.impl(name, lambda *a, _op=op, **k: tpu_fallback.cpu_fallback(_op, a, k), "PrivateUse1")
        return self

    def __exit__(self, *exc):
        self.lib._destroy()  # the dispatcher goes back to the lowering registered before


def fwd_bwd(factory, shape, amp, repeats, iters, fused=False):
    torch.manual_seed(0)
    model = factory().to("tpu")
    x = torch.randn(*shape, device="tpu")

    def step():
        with torch.autocast("tpu", dtype=torch.bfloat16, enabled=amp):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        if fused:
            loss.item()  # the usual loop's host read: a flush point

    with tt.fuse(fused):
        return median_ms(step, "tpu", repeats, iters)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    r, n = args.repeats, args.iters
    optimizers = {
        "AdamW": lambda fused, foreach: (lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=fused, foreach=foreach)),
        "SGD-momentum": lambda fused, foreach: (lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, fused=fused,
                                                                          foreach=foreach)),
    }
    models = {"block": Block, "mlp": make_mlp}
    print(f"optimizer step, ms (median of {r} runs x {n} steps)")
    print(f"{'model':6} {'optimizer':13} {'tpu fused':>10} {'tpu foreach':>12} {'tpu fallback':>13} {'cpu fused':>10}"
          f"   foreach/fused  fallback/fused")
    for model_name, factory in models.items():
        for opt_name, make in optimizers.items():
            fused = optimizer_step(factory, make(True, None), "tpu", r, n)
            foreach = optimizer_step(factory, make(None, True), "tpu", r, n)
            with _FallbackPath():
                fallback = optimizer_step(factory, make(True, None), "tpu", max(1, r // 2), max(1, n // 5))
            cpu = optimizer_step(factory, make(True, None), "cpu", r, n)
            print(f"{model_name:6} {opt_name:13} {fused:10.2f} {foreach:12.2f} {fallback:13.2f} {cpu:10.2f}"
                  f"   {foreach / fused:13.2f}  {fallback / fused:14.2f}")
    print(f"\nforward+backward, ms (median of {r} runs x {n} steps)")
    print(f"{'model':6} {'float32':>9} {'bf16 autocast':>14}   f32/bf16 {'bf16 fused eager':>17}")
    for model_name, factory, shape in (("block", Block, (8, 128, 256)), ("mlp", make_mlp, (256, 1024))):
        f32 = fwd_bwd(factory, shape, False, r, n)
        bf16 = fwd_bwd(factory, shape, True, r, n)
        bf16_fused = fwd_bwd(factory, shape, True, r, n, fused=True)  # tpu_interactive.fuse(): autocast's casts recorded
        print(f"{model_name:6} {f32:9.2f} {bf16:14.2f}   {f32 / bf16:8.2f} {bf16_fused:17.2f}")
    print(f"\njax backend: {jax.default_backend()}, {os.cpu_count()} host cores")


if __name__ == "__main__":
    main()
