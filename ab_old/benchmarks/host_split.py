"""Where a fused training step's host time goes, by owner: torch's own code, this package's recording,
starting the segment programs, and waiting for a value (``loss.item()``).

    python benchmarks/host_split.py [--d 64 --seq 24 --batch 8] [--seconds 20] [--rate 97] [--no-native]

Runs fused steps of `TransformerEncoderLayer(d, 4, 2d)` + AdamW with `loss.item()` every step (as
benchmarks/fused.py does) under py-spy (`pip install py-spy`), with `--native` so that time in C++ is
charged to the code that called it. Each sample taken inside a step goes to the first of:
- "running segments": under `fusion.Segment.run` (a flush: looking the program up, starting it);
- "waiting for values": under `dispatch.to_host` (`.item()` waiting for the device);
- "recording (ours)": under any frame of this package, Python or its C++ extension (what it calls
  included: jax, the TensorImpls it makes);
- "torch": everything else: nn.Module code, the autograd engine, the optimizer's Python, torch's
  dispatcher and its view kernels.
The step's host time per recorded op, split so, is what the issue's "host cost per recorded op"
(aim <= 10 us) is made of: torch's share is paid by any backend, CPU's included.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

STEP_FRAME = "fused_step_for_profile ("  # the child's step function, as py-spy names its frame


def child(d: int, seq: int, batch: int, seconds: float) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import torch
    import torch.nn.functional as F

    import tpu_interactive as tt

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True).to("tpu")
    x, y = torch.randn(batch, seq, d, device="tpu"), torch.randn(batch, seq, d, device="tpu")
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)

    def fused_step_for_profile():
        opt.zero_grad()
        loss = F.mse_loss(layer(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    with tt.fuse():
        for _ in range(30):  # compiles and loads: not in the timed loop (their samples lack the frame's time)
            fused_step_for_profile()
        ops, steps = tt.stats()["fused_ops"], 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            fused_step_for_profile()
            steps += 1
        elapsed = time.perf_counter() - start
        ops = (tt.stats()["fused_ops"] - ops) / steps
    print(json.dumps({"ms_per_step": elapsed / steps * 1e3, "ops_per_step": ops, "steps": steps,
                      "platform": tt.backend_info().summary}))


OWNERS = ("torch", "recording (ours)", "running segments", "waiting for values")


def owner(frames: list[str]) -> str:
    if any(f.startswith("Segment.run (") and "tpu_interactive" in f for f in frames):
        return "running segments"
    if any(f.startswith("to_host (") and "tpu_interactive" in f for f in frames):
        return "waiting for values"
    if any("tpu_interactive" in f for f in frames):
        return "recording (ours)"
    return "torch"


def split(profile: str) -> tuple[collections.Counter, collections.Counter]:
    """(samples per owner, samples of "recording (ours)" per the outermost frame of ours)."""
    counts: collections.Counter = collections.Counter()
    entries: collections.Counter = collections.Counter()
    with open(profile) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            first = next((i for i, frame in enumerate(frames) if STEP_FRAME in frame), None)
            if first is None:
                continue  # outside the step function (the warm-up's steps are in: few, at the start)
            name = owner(frames[first + 1:])
            counts[name] += int(n)
            if name == "recording (ours)":
                entries[next(frame for frame in frames[first + 1:] if "tpu_interactive" in frame)] += int(n)
    return counts, entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--seq", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=int, default=97, help="samples a second (--native: <= 100)")
    parser.add_argument("--no-native", action="store_true",
                        help="Python frames only, sampled without stopping the process (where ptrace is refused, "
                             "as on the TPU machine): C++ time is charged to its Python caller, torch's for our kernels")
    parser.add_argument("--top", type=int, default=0, help="also list the N costliest entries into our code")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.d, args.seq, args.batch, args.seconds)
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed (pip install py-spy)")
    child_args = [sys.executable, __file__, "--child", "--d", str(args.d), "--seq", str(args.seq),
                  "--batch", str(args.batch), "--seconds", str(args.seconds)]
    # the step's time without the profiler (--native stops the process for each sample); shares with it
    plain = subprocess.run(child_args, capture_output=True, text=True, check=True)
    result = json.loads(plain.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile.txt")
        command = [spy, "record", "-r", str(args.rate), "-f", "raw", "-o", profile, *(["--nonblocking"] if args.no_native else
                   ["--native"]), "--", *child_args]
        done = subprocess.run(command, capture_output=True, text=True)
        profiled = next((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")), None)
        if profiled is None or not os.path.exists(profile):
            sys.exit(f"py-spy run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        counts, entries = split(profile)
    total = sum(counts.values())
    ms, ops = result["ms_per_step"], result["ops_per_step"]
    print(f"platform: {result['platform']}")
    print(f"fused step of TransformerEncoderLayer(d {args.d}, seq {args.seq}, batch {args.batch}) + AdamW, .item() each step: {ms:.2f} ms a step "
          f"({profiled['ms_per_step']:.2f} under py-spy, whose {total} samples give the shares), {ops:.0f} "
          "recorded ops a step")
    print(f"{'owner':<22}{'share':>8}{'ms/step':>10}{'us/op':>8}")
    for name in OWNERS:
        share = counts[name] / total if total else 0.0
        print(f"{name:<22}{share:>7.1%}{share * ms:>10.2f}{share * ms / ops * 1e3:>8.1f}")
    for frame, n in entries.most_common(args.top):
        print(f"  {n / total:>6.1%}  {frame}")


if __name__ == "__main__":
    main()
