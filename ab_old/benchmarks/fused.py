"""Fused eager mode vs plain eager vs compile_train_step, side by side in one run.

    python benchmarks/fused.py [--repeats N] [--tokens N]

- Warm training step of `nn.TransformerEncoderLayer(d, 4, 2d)` + AdamW, MSE loss, `loss.item()` every
  step (the usual loop), at the tiny size (d 64, seq 24, batch 8) and the issue's size (d 256, seq 64,
  batch 16): plain eager, fused eager (`tpu_interactive.fuse()`), and `compile_train_step` (one
  program). Medians of --repeats rounds, each timing 20 steps of every mode in turn (after warm-up);
  the ratios are medians of the rounds' ratios. A fused step's program runs the previous step's
  backward and update with this step's forward (``backward()`` flushes): each timed block of fused
  steps ends its ``fuse()`` block, so its last backward and update are in its time.
- Host cost per recorded op: the fused step's host time from `zero_grad()` to the end of `opt.step()`
  (recording, and starting the program `backward()` flushes) / the ops of one step ("us/op"), and the
  same without that flush ("rec"): recording alone, the ops' Python and torch's dispatch included.
  Most of a step's ops are AdamW's `_foreach_*` calls over all parameters (one recorded op each).
- Greedy `generate()` of a tiny GPT-2 (random weights): tokens/s, plain eager vs fused, warm (three
  calls of the same length are not timed), medians of --repeats rounds of one call each, the two modes
  side by side in each round; the ratio is the median of the rounds' ratios.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tpu_interactive as tt  # noqa: E402
from tpu_interactive.backend import fusion  # noqa: E402
from tpu_interactive.backend.stats import STATS  # noqa: E402


def _block(d: int, seq: int, batch: int):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True).to("tpu")
    x, y = torch.randn(batch, seq, d, device="tpu"), torch.randn(batch, seq, d, device="tpu")
    return layer, x, y


STEPS = 20  # per timed block: a fused block's first forward and last update run as programs of their own


def _step_ms(step, steps: int = STEPS) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.tpu.synchronize()  # what the steps started (an update after loss.item()) is in their time
    return (time.perf_counter() - start) / steps * 1e3


def train_row(d: int, seq: int, batch: int, repeats: int) -> dict:
    # each mode its own copy of the block and its own optimizer: compile_train_step keeps AdamW's step
    # counts on the device, which would add ops to the other modes' steps
    layer, x, y = _block(d, seq, batch)
    layers = {mode: copy.deepcopy(layer) for mode in ("eager", "fused", "step")}
    opts = {mode: torch.optim.AdamW(m.parameters(), lr=1e-3) for mode, m in layers.items()}

    def eager_step(mode: str = "eager"):
        opts[mode].zero_grad()
        loss = F.mse_loss(layers[mode](x), y)
        loss.backward()
        opts[mode].step()
        return loss.item()

    def fused_step():
        with tt.fuse():  # leaving the block runs the last step's backward and update
            for _ in range(STEPS):
                eager_step("fused")

    compiled = tt.compile_train_step(layers["step"], lambda m, a, b: F.mse_loss(m(a), b), opts["step"])
    modes = {"eager": lambda: _step_ms(eager_step), "fused": lambda: _step_ms(fused_step, 1) / STEPS,
             "step": lambda: _step_ms(lambda: compiled(x, y).item())}
    for run in modes.values():  # warm-up
        run(), run()
    times: dict = {mode: [] for mode in modes}
    for _ in range(repeats):  # side by side in rounds: this machine's speed drifts
        for mode, run in modes.items():
            times[mode].append(run())
    row = {mode: statistics.median(t) for mode, t in times.items()}
    row["fused_ratio"] = statistics.median([f / s for f, s in zip(times["fused"], times["step"])])
    row["eager_ratio"] = statistics.median([e / s for e, s in zip(times["eager"], times["step"])])
    layer, opt = layers["fused"], opts["fused"]
    with tt.fuse():
        record = []
        eager_step("fused")  # from here on, every backward() runs one step's ops
        for _ in range(5):  # host time of recording one step, and of starting its one program
            before = tt.stats()["fused_ops"]
            flushes = STATS.fused_segments
            start = time.perf_counter()
            opt.zero_grad()
            loss = F.mse_loss(layer(x), y)
            loss.backward()  # runs what is recorded: the previous step's backward and update, this forward
            opt.step()
            seconds = time.perf_counter() - start
            new_runs = STATS.fused_segments - flushes  # one or two: the last of STATS.recent_fused
            flushed = sum(run.seconds for run in list(STATS.recent_fused)[len(STATS.recent_fused) - new_runs:])
            pending = len(fusion.current().steps)  # this backward and update: they run with the next forward
            loss.item()
            ops = tt.stats()["fused_ops"] - before  # one step's ops (in a steady loop, as many as recorded)
            assert ops >= pending > 0
            record.append((seconds / ops * 1e6, (seconds - flushed) / ops * 1e6))
        row["us_per_op"], row["rec_us_per_op"] = (statistics.median(r) for r in zip(*record))
        row["ops"] = ops
    return row


def generate_row(tokens: int, repeats: int) -> dict:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=256)
    model = transformers.GPT2LMHeadModel(cfg).eval().to("tpu")
    prompt = torch.randint(0, 256, (1, 8), device="tpu")
    def timed(fused: bool) -> tuple[float, torch.Tensor]:
        with torch.no_grad(), tt.fuse(fused):
            start = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return time.perf_counter() - start, out.cpu()

    for _ in range(3):  # warm-up: the first calls of this length compile (in fused mode, also the op-by-op
        timed(False), timed(True)  # programs of the decode steps' first probes: fusion._not_recorded)
    times: dict = {False: [], True: []}
    ratios = []
    for _ in range(repeats):  # side by side in rounds: this machine's speed drifts
        (eager, eager_tokens), (fused, fused_tokens) = timed(False), timed(True)
        assert torch.equal(fused_tokens, eager_tokens), "fused generate() differs from eager"
        times[False].append(eager)
        times[True].append(fused)
        ratios.append(eager / fused)
    return {"eager": tokens / statistics.median(times[False]), "fused": tokens / statistics.median(times[True]),
            "ratio": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    print(f"platform: {tt.backend_info().summary}")
    print(f"{'train step (ms, AdamW, .item() per step)':<44}{'eager':>9}{'fused':>9}{'step':>9}"
          f"{'fused/step':>12}{'eager/step':>12}{'us/op':>8}{'rec':>6}{'ops':>6}")
    for d, seq, batch in ((64, 24, 8), (256, 64, 16)):
        r = train_row(d, seq, batch, args.repeats)
        print(f"{f'TransformerEncoderLayer d{d} seq{seq} batch{batch}':<44}{r['eager']:>9.2f}{r['fused']:>9.2f}"
              f"{r['step']:>9.2f}{r['fused_ratio']:>11.2f}x{r['eager_ratio']:>11.2f}x"
              f"{r['us_per_op']:>8.1f}{r['rec_us_per_op']:>6.1f}{r['ops']:>6}")
    g = generate_row(args.tokens, args.repeats)
    print(f"tiny GPT-2 greedy generate(), {args.tokens} new tokens: eager {g['eager']:.1f} tokens/s, "
          f"fused {g['fused']:.1f} tokens/s (fused/eager {g['ratio']:.2f}x, median of per-round ratios), same tokens")


if __name__ == "__main__":
    main()
