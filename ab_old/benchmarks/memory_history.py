"""Cost of torch.tpu.memory._record_memory_history on an eager op loop: recording off vs on.

    python benchmarks/memory_history.py [-n 2000] [--repeats 7]

Each repeat times N small eager ops (each allocates one output buffer and frees the previous one)
and reports the median per-op time; "off" is the default state (the hot path tests one flag).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import tpu_interactive  # noqa: F401


def _loop(n: int) -> float:
    x = torch.ones(64, 64, device="tpu")
    y = x
    start = time.perf_counter()
    for _ in range(n):
        y = y + x  # one alloc, one free of the previous y
    torch.tpu.synchronize()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    memory = torch.tpu.memory
    _loop(200)  # compile and warm up
    modes = {"off": None, "on, stacks=python": "python", "on, stacks=all": "all", "on, context=None": "none"}
    results = {name: [] for name in modes}
    for _ in range(args.repeats):  # interleaved, so drift in machine load hits every mode alike
        for name, mode in modes.items():
            if mode is None:
                memory._record_memory_history(None)
            elif mode == "none":
                memory._record_memory_history("all", context=None, clear_history=True)
            else:
                memory._record_memory_history("all", stacks=mode, clear_history=True)
            results[name].append(_loop(args.n))
            memory._record_memory_history(None)
    base = statistics.median(results["off"])
    print(f"{'recording':<22}{'median us/op':>14}{'overhead':>10}")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:<22}{med:>14.1f}{100 * (med - base) / base:>9.0f}%")
    # the recording itself, without the op: one alloc + one free event pair through the hooks
    from tpu_interactive.backend import memory_history

    for stacks in ("python", "all"):
        memory._record_memory_history("all", stacks=stacks, clear_history=True)
        start = time.perf_counter()
        for i in range(args.n):
            memory_history.on_alloc(memory_history.base_address() + 256 * i, 16384)
            memory_history.on_free(memory_history.base_address() + 256 * i, 16384)
        pair_us = (time.perf_counter() - start) / args.n * 1e6
        memory._record_memory_history(None)
        print(f"hooks alone, stacks={stacks}: {pair_us:.1f} us per alloc+free pair "
              f"(stack depth {len(memory_history._recorder.trace[-1][3]) // 2})")
    snap = memory._snapshot()
    print(f"last recording: {len(snap['device_traces'][0])} events, max_entries default "
          f"{tpu_interactive.backend.memory_history.DEFAULT_MAX_ENTRIES}")


if __name__ == "__main__":
    main()
