"""Fused eager mode's training memory: segments donating what they overwrite vs not, side by side.

    python benchmarks/fused_memory.py [--steps N] [--repeats N] [--cases mlp-adamw lm-adamw ...]

Each case runs in a fresh process per setting (`TPU_FUSE_DONATE=0`; the default, which donates
arrays of 1 MiB or more except on XLA:CPU; `=1`, any size), fused mode on (`tpu_interactive.fuse()`,
`loss.item()` every step): 12x `Linear(2048, 2048)` + ReLU (192 MiB of parameters, batch 64) with AdamW and with
SGD-momentum, `nn.TransformerEncoderLayer(256, 4, 512)` (seq 64, batch 16) with AdamW, and a small language
model with AdamW: `Embedding(16384, 1024)`, 4x `Linear(1024, 1024)` + GELU, a `Linear(1024, 16384)` head
(144 MiB of parameters; tokens 8 x 128, cross-entropy): its step's segment checks the embedding's indices.
Printed: the device's resident bytes after 4 warm-up steps, its peak (the process's, from
`jax.Device.memory_stats()`: a TPU or GPU; XLA:CPU reports none), the median ms per step of
--repeats rounds of --steps steps, and the last loss (equal in every setting).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = (("mlp", "adamw"), ("mlp", "sgd"), ("block", "adamw"), ("lm", "adamw"))


def run_case(kind: str, opt_name: str, steps: int, repeats: int) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import jax
    import torch

    import tpu_interactive as tt
    from tpu_interactive.backend import segment_program

    torch.manual_seed(0)
    if kind == "mlp":
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU())
                                      for _ in range(12)]).to("tpu")
        x, y = torch.randn(64, 2048, device="tpu"), torch.randn(64, 2048, device="tpu")
    elif kind == "lm":
        hidden = [torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(4)]
        model = torch.nn.Sequential(torch.nn.Embedding(16384, 1024), *hidden, torch.nn.Linear(1024, 16384)).to("tpu")
        x, y = torch.randint(0, 16384, (8, 128), device="tpu"), torch.randint(0, 16384, (8 * 128,), device="tpu")
    else:
        model = torch.nn.TransformerEncoderLayer(256, 4, 512, dropout=0.0, batch_first=True).to("tpu")
        x, y = torch.randn(16, 64, 256, device="tpu"), torch.randn(16, 64, 256, device="tpu")
    loss_of = (torch.nn.functional.mse_loss if kind != "lm"
               else lambda logits, target: torch.nn.functional.cross_entropy(logits.flatten(0, 1), target))
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if opt_name == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))

    def step() -> float:
        loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    device = jax.devices()[0]
    with tt.fuse():
        for _ in range(4):
            step()
        torch.tpu.synchronize()
        resident = (device.memory_stats() or {}).get("bytes_in_use")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                loss = step()
            torch.tpu.synchronize()
            times.append((time.perf_counter() - start) / steps * 1e3)
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    floor = segment_program.donation_floor()
    print(f"{kind + ' ' + opt_name:<12} {'off' if floor is None else f'>= {floor} B':>12} {_mib(resident):>9} "
          f"{_mib(peak):>9} {_mib(None if peak is None else peak - resident):>10} "
          f"{statistics.median(times):>8.2f} {loss:>12.6f}", flush=True)


def _mib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    names = [f"{kind}-{opt_name}" for kind, opt_name in CASES]
    parser.add_argument("--cases", nargs="+", choices=names, default=names)
    parser.add_argument("--case", nargs=2, help=argparse.SUPPRESS)  # a child process's case
    args = parser.parse_args()
    if args.case:
        run_case(*args.case, args.steps, args.repeats)
        return
    print(f"{'case':<12} {'donating':>12} {'res MiB':>9} {'peak MiB':>9} {'above MiB':>10} {'ms/step':>8} {'last loss':>12}")
    for kind, opt_name in (name.split("-") for name in args.cases):
        for donate in ("0", None, "1"):
            env = dict(os.environ)
            env.pop("TPU_FUSE_DONATE", None)
            if donate is not None:
                env["TPU_FUSE_DONATE"] = donate
            subprocess.run([sys.executable, __file__, "--case", kind, opt_name, "--steps", str(args.steps),
                            "--repeats", str(args.repeats)], env=env, check=True)


if __name__ == "__main__":
    main()
