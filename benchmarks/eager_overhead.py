"""Per-op latency of small eager ops: tpu device vs raw jax.numpy vs torch CPU, in one run.

    python benchmarks/eager_overhead.py [--profile]

Each op is run N times back to back and the device is synchronised once at the end, so the numbers
are per-op dispatch+execution cost as a notebook user sees it in a loop. The 'fused' column records
the same loop in fused eager mode (`tpu_interactive.fuse()`) and runs it as one cached program at the
synchronize: the host cost of recording an op plus its share of that program (results nobody keeps
are not computed, as in any jitted program). `--profile` prints where the tpu path spends its time
(cProfile, top functions).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import jax
import jax.numpy as jnp
import torch

import tpu_interactive  # noqa: F401


def _time(fn, sync, n):
    for _ in range(20):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            out = fn()
        sync(out)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    cases = {
        "add (128,)": ((128,), (128,), lambda a, b: a + b, lambda a, b: a + b),
        "mul scalar (64,64)": ((64, 64), None, lambda a, b: a * 2.0, lambda a, b: a * 2.0),
        "matmul (64,64)@(64,64)": ((64, 64), (64, 64), lambda a, b: a @ b, lambda a, b: a @ b),
        "relu (256,256)": ((256, 256), None, lambda a, b: torch.relu(a), lambda a, b: jnp.maximum(a, 0)),
        "sum (256,256)": ((256, 256), None, lambda a, b: a.sum(), lambda a, b: jnp.sum(a)),
    }
    print(f"platform: {tpu_interactive.backend_info().summary}")
    print(f"{'op':<26}{'tpu eager us':>14}{'fused us':>10}{'raw jax us':>12}{'torch cpu us':>14}{'tpu/jax':>9}"
          f"{'fused/jax':>10}{'tpu/cpu':>9}")
    for name, (sa, sb, torch_fn, jax_fn) in cases.items():
        ca = torch.randn(*sa)
        cb = torch.randn(*sb) if sb else None
        ta, tb = ca.to("tpu"), (cb.to("tpu") if cb is not None else None)
        ja, jb = jnp.asarray(ca.numpy()), (jnp.asarray(cb.numpy()) if cb is not None else None)
        tpu_us = _time(lambda: torch_fn(ta, tb), lambda out=None: torch.tpu.synchronize(), args.n)
        with tpu_interactive.fuse():
            fused_us = _time(lambda: torch_fn(ta, tb), lambda out=None: torch.tpu.synchronize(), args.n)
        jax_us = _time(lambda: jax_fn(ja, jb), lambda out=None: jax.block_until_ready(out), args.n)
        cpu_us = _time(lambda: torch_fn(ca, cb), lambda out=None: None, args.n)
        print(f"{name:<26}{tpu_us:>14.1f}{fused_us:>10.1f}{jax_us:>12.1f}{cpu_us:>14.1f}{tpu_us / jax_us:>8.2f}x"
              f"{fused_us / jax_us:>9.2f}x{tpu_us / cpu_us:>8.1f}x")

    if args.profile:
        ta, tb = torch.randn(128).to("tpu"), torch.randn(128).to("tpu")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            ta + tb
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
