"""Cold start: what the first training steps cost, and what the persistent compilation cache saves.

    python benchmarks/cold_start.py [--runs N] [--d-model 64]

Each measurement runs in a fresh Python process (nothing compiled in memory) with its own cache
directory, on one `nn.TransformerEncoderLayer(d, 4, 2d)` + AdamW training step:
- 'eager first step': plain eager, empty persistent cache (every op's programs compiled, on background
  threads while the step runs ahead of them: compile_ahead.py); 'compile ahead off': the same with
  every program compiled on the calling thread when its op runs;
- 'eager 2nd shape': the next step at a new sequence length, same process;
- 'eager warm step': a step at an already seen shape (median of 5);
- 'eager, warm disk cache': the first step in a second process whose persistent cache the first
  process filled (programs loaded from disk instead of compiled);
- 'one-program step': `compile_train_step`, first call (trace + one XLA compile) with an empty cache;
- the same eager rows in fused eager mode (`tpu_interactive.fuse()`): the first step records and
  compiles one program (the optimizer creates its state there), the second step compiles the steady
  step's program, later steps reuse it; 'fused, warm disk cache' loads both from disk.
Every timed eager or fused step ends with ``torch.tpu.synchronize()``: with compile ahead
(compile_ahead.py) ``loss.item()`` waits only for the calls the loss depends on, and the optimizer's
update may still be compiling. Reported: the median over --runs runs of each, XLA programs compiled,
and ratios. Every process
imports ``torch._dynamo`` before it is timed (torch's meta kernels import it on their first call: a
one-time ~0.9 s the one-program row's warm-up call would otherwise have paid outside its timing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.join(os.path.dirname(__file__), "..")

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch, tpu_interactive as tt
# torch's own meta kernels import torch._dynamo on their first call (~0.9 s here): a one-time cost of
# the process, which the one-program row's warm-up call has paid before it is timed; counted with the
# imports for every row alike
import torch._dynamo
import_s = time.perf_counter() - t0
d, mode = {d}, "{mode}"
tt.fuse(mode.startswith("fused"))
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True).to("tpu")
opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)

def eager_step(x):
    opt.zero_grad()
    loss = layer(x).square().mean()
    loss.backward()
    opt.step()
    value = loss.item()
    torch.tpu.synchronize()  # the whole step has run: the optimizer's update too (compile ahead defers it)
    return value

def timed(fn, *args):
    start = time.perf_counter(); fn(*args); return time.perf_counter() - start

out = {{"import_s": import_s}}
x = torch.randn(8, 24, d, device="tpu")
if mode == "step":
    step = tt.compile_train_step(layer, lambda m, x: m(x).square().mean(), opt)
    step(x).item()  # the first call runs eagerly (optimizer state is created there)
    before = tt.stats()["xla_compiles"]
    out["first"] = timed(lambda: step(x).item())
    out["programs"] = tt.stats()["xla_compiles"] - before
else:
    out["first"] = timed(eager_step, x)
    out["programs"] = tt.stats()["xla_compiles"]
    out["disk"] = tt.stats()["xla_disk_hits"]
    if mode in ("eager", "fused"):
        out["second"] = timed(eager_step, x)
        out["second_shape"] = timed(eager_step, torch.randn(8, 25, d, device="tpu"))
        out["warm"] = sorted(timed(eager_step, x) for _ in range(5))[2]
print("RESULT " + json.dumps(out))
"""


def child(mode: str, d: int, cache_dir: str, ahead: bool = True) -> dict:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)  # keep the caller's
    env = {**os.environ, "TPU_INTERACTIVE_CACHE_DIR": cache_dir, "PYTHONPATH": path,
           "TPU_INTERACTIVE_COMPILE_AHEAD": str(int(ahead))}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD.format(d=d, mode=mode))],
                            env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=64)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    programs: dict[str, int] = {}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as step_cache:
            cold = child("eager", args.d_model, cache)
            warm_disk = child("eager-disk", args.d_model, cache)  # same cache dir: filled by `cold`
        with tempfile.TemporaryDirectory() as cache:
            fused = child("fused", args.d_model, cache)
            fused_disk = child("fused-disk", args.d_model, cache)
        with tempfile.TemporaryDirectory() as cache:
            serial = child("eager-serial", args.d_model, cache, ahead=False)
        with tempfile.TemporaryDirectory() as step_cache:
            step = child("step", args.d_model, step_cache)
        for kind, first, disk in (("eager", cold, warm_disk), ("fused", fused, fused_disk)):
            for name, value in ((f"{kind} first step", first["first"]), (f"{kind} second step", first["second"]),
                                (f"{kind} 2nd shape", first["second_shape"]), (f"{kind} warm step", first["warm"]),
                                (f"{kind}, warm disk cache", disk["first"])):
                rows.setdefault(name, []).append(value)
            programs.update({f"{kind} first step": first["programs"], f"{kind}, warm disk cache": disk["disk"]})
        rows.setdefault("eager first step, compile ahead off", []).append(serial["first"])
        programs["eager first step, compile ahead off"] = serial["programs"]
        rows.setdefault("one-program step (first call)", []).append(step["first"])
        programs["one-program step (first call)"] = step["programs"]
    med = {name: statistics.median(values) for name, values in rows.items()}
    print(f"TransformerEncoderLayer(d={args.d_model}) + AdamW, medians of {args.runs} runs (fresh processes)")
    print(f"{'measurement':38s} {'seconds':>9s} {'XLA programs':>13s}")
    for name, value in med.items():
        print(f"{name:38s} {value:9.3f} {programs.get(name, ''):>13}")
    one = med["one-program step (first call)"]
    for kind in ("eager", "fused"):
        print(f"{kind} cold first step / one-program cold step: {med[f'{kind} first step'] / one:.2f}x; "
              f"first step with warm disk cache / cold: {med[f'{kind}, warm disk cache'] / med[f'{kind} first step']:.2f}x")


if __name__ == "__main__":
    main()
