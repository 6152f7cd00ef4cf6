"""Per-op latency of small eager ops: tpu device vs raw jax.numpy vs torch CPU, in one run.

    python benchmarks/eager_overhead.py [--profile]

Each op is run N times back to back and the device is synchronised once at the end, so the numbers
are per-op dispatch+execution cost as a notebook user sees it in a loop. Every column's loop runs once
per round, side by side (this shared VM's speed drifts): times are medians over rounds, ratios the
medians of the per-round ratios. The 'fused' column records
the same loop in fused eager mode (`tpu_interactive.fuse()`) and runs it as one cached program at the
synchronize: the host cost of recording an op plus its share of that program (results nobody keeps
are not computed, as in any jitted program). `--profile` prints where the tpu path spends its time
(cProfile, top functions).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import jax
import jax.numpy as jnp
import torch

import tpu_interactive  # noqa: F401


def _loop(fn, sync, fused: bool = False):
    """A timed loop: n calls of fn, synchronised at the end (in fused mode: recorded, run at the
    synchronize); returns microseconds per call."""
    def run(n: int) -> float:
        with tpu_interactive.fuse(fused):
            start = time.perf_counter()
            for _ in range(n):
                out = fn()
            sync(out)
            return (time.perf_counter() - start) / n * 1e6

    return run


def _side_by_side(loops: dict, n: int, rounds: int) -> dict:
    """Each loop timed once per round, all loops back to back in every round (this shared 2-core VM
    drifts between seconds): per loop, the list of its rounds' times."""
    for run in loops.values():
        run(20)
    per_round = {name: [] for name in loops}
    for _ in range(rounds):
        for name, run in loops.items():
            per_round[name].append(run(n))
    return per_round


def _median_ratio(a: list, b: list) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def main() -> None:
    # torch CPU single-threaded: its OpenMP threads spin for a while after a parallel region (a
    # matmul) and, on a 2-core machine, would slow whichever column runs next in the round
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=300, help="calls per timed loop")
    parser.add_argument("--rounds", type=int, default=15, help="timed loops per column (medians)")
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
        sync_tpu = lambda out=None: torch.tpu.synchronize()  # noqa: E731
        loops = {
            "tpu": _loop(lambda: torch_fn(ta, tb), sync_tpu),
            "fused": _loop(lambda: torch_fn(ta, tb), sync_tpu, fused=True),
            "jax": _loop(lambda: jax_fn(ja, jb), lambda out=None: jax.block_until_ready(out)),
            "cpu": _loop(lambda: torch_fn(ca, cb), lambda out=None: None),
        }
        t = _side_by_side(loops, args.n, args.rounds)
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"{name:<26}{med['tpu']:>14.1f}{med['fused']:>10.1f}{med['jax']:>12.1f}{med['cpu']:>14.1f}"
              f"{_median_ratio(t['tpu'], t['jax']):>8.2f}x{_median_ratio(t['fused'], t['jax']):>9.2f}x"
              f"{_median_ratio(t['tpu'], t['cpu']):>8.1f}x")

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
