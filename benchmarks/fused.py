"""Fused eager mode vs plain eager vs compile_train_step, side by side in one run.

    python benchmarks/fused.py [--repeats N] [--tokens N]

- Warm training step of `nn.TransformerEncoderLayer(d, 4, 2d)` + AdamW, MSE loss, `loss.item()` every
  step (the usual loop), at the tiny size (d 64, seq 24, batch 8) and the issue's size (d 256, seq 64,
  batch 16): plain eager, fused eager (`tpu_interactive.fuse()`), and `compile_train_step` (one
  program). Medians of --repeats runs of 5 steps each, after warm-up.
- Host cost per recorded op: the fused step's recording time (before its flush) / ops recorded.
- Greedy `generate()` of a tiny GPT-2 (random weights): tokens/s, plain eager vs fused, warm (three
  calls of the same length are not timed), medians of --repeats rounds of one call each, the two modes
  side by side in each round; the ratio is the median of the rounds' ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tpu_interactive as tt  # noqa: E402
from tpu_interactive.backend import fusion  # noqa: E402


def _block(d: int, seq: int, batch: int):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True).to("tpu")
    x, y = torch.randn(batch, seq, d, device="tpu"), torch.randn(batch, seq, d, device="tpu")
    return layer, x, y


def _median_step_ms(step, repeats: int, steps: int = 5) -> float:
    for _ in range(3):
        step()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        runs.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(runs)


def train_row(d: int, seq: int, batch: int, repeats: int) -> dict:
    layer, x, y = _block(d, seq, batch)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)

    def eager_step():
        opt.zero_grad()
        loss = F.mse_loss(layer(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    row = {"eager": _median_step_ms(eager_step, repeats)}
    with tt.fuse():
        row["fused"] = _median_step_ms(eager_step, repeats)
        record = []
        for _ in range(5):  # host time of recording one step (its flush is loss.item())
            before = tt.stats()["fused_ops"]
            start = time.perf_counter()
            opt.zero_grad()
            loss = F.mse_loss(layer(x), y)
            loss.backward()
            opt.step()
            seconds = time.perf_counter() - start
            ops = len(fusion.current().steps)
            loss.item()
            assert tt.stats()["fused_ops"] - before == ops
            record.append(seconds / ops * 1e6)
        row["us_per_op"], row["ops"] = statistics.median(record), ops
    step = tt.compile_train_step(layer, lambda m, a, b: F.mse_loss(m(a), b), opt)
    row["step"] = _median_step_ms(lambda: step(x, y).item(), repeats)
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
          f"{'fused/step':>12}{'eager/step':>12}{'us/op':>8}{'ops':>6}")
    for d, seq, batch in ((64, 24, 8), (256, 64, 16)):
        r = train_row(d, seq, batch, args.repeats)
        print(f"{f'TransformerEncoderLayer d{d} seq{seq} batch{batch}':<44}{r['eager']:>9.2f}{r['fused']:>9.2f}"
              f"{r['step']:>9.2f}{r['fused'] / r['step']:>11.2f}x{r['eager'] / r['step']:>11.2f}x"
              f"{r['us_per_op']:>8.1f}{r['ops']:>6}")
    g = generate_row(args.tokens, args.repeats)
    print(f"tiny GPT-2 greedy generate(), {args.tokens} new tokens: eager {g['eager']:.1f} tokens/s, "
          f"fused {g['fused']:.1f} tokens/s (fused/eager {g['ratio']:.2f}x, median of per-round ratios), same tokens")


if __name__ == "__main__":
    main()
