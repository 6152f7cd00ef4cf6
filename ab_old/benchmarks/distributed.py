"""torch.distributed on tpu tensors: DDP step time and all_reduce bandwidth (tpu_interactive.launch).

    python benchmarks/distributed.py [--repeats N] [--steps N]

1. DDP training step (forward, backward with the gradient all-reduce, SGD) of an MLP
   (512 -> 1024 -> 1024 -> 512, 2.1 M parameters), per-rank batch 64: 2 processes vs 1 process
   (the same per-rank batch, no communication). Ideal data-parallel scaling is a ratio of 1.0.
   Side by side, the same three runs with torch's own stack on CPU tensors (gloo, one intra-op
   thread per process: with torch's default two threads each, two processes oversubscribe two
   cores), and the 2-process step under ``DDP.no_sync()`` (no gradient all-reduce): what
   communication adds, on each stack. Then the same rows with every process pinned to a core of its
   own (the 1-process run to one core): the 2-process ratio then measures what data parallelism
   costs per step (the gradient all-reduce, DDP's bucketing) instead of two processes splitting the
   cores one process had to itself, as each TPU process has a chip of its own.
2. FSDP2 step: the same MLP with ``fully_shard`` per Linear and at the root, 2 processes, vs the same
   unsharded 1-process step, on both stacks.
3. all_reduce (SUM) of float32 tensors of 64 KiB .. 16 MiB between 2 processes: the tpu process group
   (XLA collective over gloo on XLA:CPU) vs torch's gloo group on CPU tensors, as algorithm bandwidth
   (bytes / time).
Printed: medians of --repeats timed runs, each --steps iterations after warm-up; every timed run ends
with torch.tpu.synchronize(), and the all_reduce loop reads nothing back in between.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tpu_interactive as tt  # noqa: E402

SIZES = [64 << 10, 1 << 20, 16 << 20]


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 512))


def _fully_shard(model: torch.nn.Module, device: str) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (dist.get_world_size(),))  # fully_shard's default is the accelerator's
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _pin_to_own_core() -> None:
    """Pin every thread of this process (XLA's, gloo's, torch's) to core ``LOCAL_RANK``."""
    core = {int(os.environ.get("LOCAL_RANK", "0")) % os.cpu_count()}
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), core)


def ddp_step_ms(repeats: int, steps: int, device: str = "tpu", sync_gradients: bool = True,
                wrap: str = "ddp", pinned: bool = False) -> float:
    """Median ms per DDP step on this rank (plain module when the world has one process).
    ``device="cpu"``: torch's gloo group on CPU tensors, one intra-op thread. ``sync_gradients=False``:
    every step under ``no_sync()`` (the step without its all-reduce). ``wrap="fsdp2"``: FSDP2
    ``fully_shard`` per Linear and at the root instead of DDP (parameters all-gathered before each
    layer's forward and backward, gradients reduce-scattered). ``pinned``: this process runs on one
    core of its own (threads created later inherit it)."""
    import contextlib

    from torch.nn.parallel import DistributedDataParallel as DDP

    if pinned:
        _pin_to_own_core()
    if device == "cpu":
        torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("tpu" if device == "tpu" else "gloo")
    torch.manual_seed(0)
    model = _mlp().to(device)
    if dist.is_initialized():
        model = DDP(model) if wrap == "ddp" else _fully_shard(model, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 512, device=device), torch.randn(64, 512, device=device)

    def step():
        with contextlib.nullcontext() if sync_gradients or not dist.is_initialized() else model.no_sync():
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.tpu.synchronize()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.tpu.synchronize()
        runs.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(runs)


def allreduce_gbps(repeats: int, steps: int) -> dict:
    """{(backend, bytes): GB/s}: tpu group on tpu tensors vs gloo on CPU tensors."""
    dist.init_process_group("tpu")
    gloo = dist.new_group(backend="gloo")
    result = {}
    for nbytes in SIZES:
        for backend, device, group in (("tpu", "tpu", None), ("gloo", "cpu", gloo)):
            t = torch.ones(nbytes // 4, device=device)
            for _ in range(2):
                dist.all_reduce(t, group=group)
            torch.tpu.synchronize()
            runs = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    dist.all_reduce(t, group=group)
                torch.tpu.synchronize()
                runs.append(nbytes * steps / (time.perf_counter() - start) / 1e9)
            result[(backend, nbytes)] = statistics.median(runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print("DDP step, MLP 2.1 M params, batch 64 per rank (ms; ratio to 1 process):")
    for pinned in (False, True):
        if pinned:
            print("  the same, each process pinned to a core of its own (1 process: one core):")
        for device, label in (("tpu", "tpu (XLA collectives)"), ("cpu", "torch CPU + gloo, 1 thread")):
            one, two, quiet = (tt.launch(ddp_step_ms, args.repeats, args.steps, device, sync, "ddp", pinned,
                                         nprocs=n, timeout_s=900) for n, sync in ((1, True), (2, True), (2, False)))
            print(f"  {label:<28} 1 process {one:6.1f}   2 processes {two:6.1f} ({two / one:.2f}x)   "
                  f"2 processes, no_sync {quiet:6.1f} ({quiet / one:.2f}x)")
    print("FSDP2 step (fully_shard per Linear + root), same MLP and batch (ms; ratio to 1 process, unsharded):")
    for device, label in (("tpu", "tpu (XLA collectives)"), ("cpu", "torch CPU + gloo, 1 thread")):
        one = tt.launch(ddp_step_ms, args.repeats, args.steps, device, nprocs=1, timeout_s=900)
        two = tt.launch(ddp_step_ms, args.repeats, args.steps, device, True, "fsdp2", nprocs=2, timeout_s=900)
        print(f"  {label:<28} 1 process {one:6.1f}   2 processes {two:6.1f} ({two / one:.2f}x)")
    bw = tt.launch(allreduce_gbps, args.repeats, args.steps, nprocs=2, timeout_s=900)
    print("all_reduce SUM float32, 2 processes (GB/s, algorithm bandwidth):")
    for nbytes in SIZES:
        print(f"  {nbytes >> 10:>6} KiB: tpu {bw[('tpu', nbytes)]:.3f}   gloo (CPU tensors) {bw[('gloo', nbytes)]:.3f}")


if __name__ == "__main__":
    main()
