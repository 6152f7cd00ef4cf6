"""Does ``.to("tpu", non_blocking=True)`` from pinned memory overlap with device compute?

    python benchmarks/pinned_transfer.py [--mb 64] [--repeats 9]

Per repeat, with the device idle at the start of each variant:
  compute   a chain of matmuls on the device, then synchronize
  transfer  one pinned host batch -> device, then synchronize
  serial    compute; synchronize; blocking copy; synchronize   (what a blocking loader does)
  overlap   compute dispatched; non_blocking copy from pinned memory; synchronize
  call_nb / call_blk  host time until a non_blocking (pinned) / blocking copy call returns
Prints medians and overlap/serial (1.0 = no overlap; compute+transfer -> max(compute, transfer)
is the ideal). On XLA:CPU compute and copies share the host's cores, so the gain is bounded there.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import tpu_interactive  # noqa: F401


def _timed(fn) -> float:
    torch.tpu.synchronize()
    start = time.perf_counter()
    out = fn()  # kept alive: synchronize waits for the work behind live tensors
    torch.tpu.synchronize()
    del out
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64, help="host batch size in MiB")
    parser.add_argument("--matmuls", type=int, default=6)
    parser.add_argument("--size", type=int, default=1024, help="matmul side")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    batch = torch.randn(args.mb * 2**20 // 4).pin_memory()
    pageable = batch.clone()
    w = torch.randn(args.size, args.size, device="tpu") / args.size**0.5

    def compute():
        y = w
        for _ in range(args.matmuls):
            y = y @ w
        return y

    variants = {
        "compute": compute,
        "transfer": lambda: batch.to("tpu", non_blocking=True),
        "serial": lambda: (compute(), torch.tpu.synchronize(), pageable.to("tpu")),
        "overlap": lambda: (compute(), batch.to("tpu", non_blocking=True)),
    }
    for fn in variants.values():  # compile and warm up
        _timed(fn)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(_timed(fn))
    # host time until the copy call returns (device idle first): what the training loop waits for
    for name, fn in (("call_nb", lambda: batch.to("tpu", non_blocking=True)), ("call_blk", lambda: pageable.to("tpu"))):
        times[name] = []
        for _ in range(args.repeats):
            torch.tpu.synchronize()
            start = time.perf_counter()
            out = fn()
            times[name].append((time.perf_counter() - start) * 1e3)
            del out
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"batch {args.mb} MiB pinned={batch.is_pinned()}, {args.matmuls} matmuls of {args.size}^2, "
          f"{args.repeats} repeats, medians (ms):")
    for name, value in med.items():
        print(f"  {name:<9} {value:8.1f}")
    print(f"overlap/serial = {med['overlap'] / med['serial']:.2f}  "
          f"(ideal max(compute, transfer)/serial = {max(med['compute'], med['transfer']) / med['serial']:.2f})")


if __name__ == "__main__":
    main()
