"""Large-op throughput: a matmul through the `tpu` torch device vs the same matmul in raw jax.jit.

    python benchmarks/throughput.py [--sizes 2048,4096,8192] [--iters N]

Per-op overhead (benchmarks/eager_overhead.py) dominates tiny ops; this shows the other end: at
accelerator sizes an eager `torch.matmul` on `tpu` should run at the chip's rate, as jax does.
bfloat16 inputs use the chip's native rate; float32 runs at torch's default 'highest' matmul
precision on both sides (several bf16 passes on a TPU). Printed: TFLOP/s (2·n³ / time), medians of
5 timed runs of --iters back-to-back calls, each run ending with a device synchronize.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import tpu_interactive as tt  # noqa: E402


def median_seconds(call, sync, iters: int, repeats: int = 5) -> float:
    sync(call())  # compile
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            out = call()
        sync(out)
        runs.append((time.perf_counter() - start) / iters)
    return sorted(runs)[repeats // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    print(f"platform: {jax.default_backend()} ({jax.devices()[0].device_kind}); {tt.backend_info()}")
    print(f"{'matmul':<22}{'tpu torch TFLOP/s':>19}{'jax.jit TFLOP/s':>17}{'torch/jax':>11}{'max |diff|':>12}")
    for dtype in (torch.bfloat16, torch.float32):
        for n in (int(s) for s in args.sizes.split(",")):
            a = torch.randn(n, n, dtype=dtype, device="tpu")
            b = torch.randn(n, n, dtype=dtype, device="tpu")
            t_torch = median_seconds(lambda: a @ b, lambda _: tt.synchronize(), args.iters)
            jax_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
            aj, bj = (jnp.asarray(x.float().cpu().numpy()).astype(jax_dtype) for x in (a, b))
            mm = jax.jit(lambda x, y: jnp.matmul(x, y, precision="highest"))
            t_jax = median_seconds(lambda: mm(aj, bj), jax.block_until_ready, args.iters)
            diff = (a @ b).float().cpu() - torch.from_numpy(jax.device_get(mm(aj, bj).astype(jnp.float32)).copy())
            flops = 2 * n ** 3
            print(f"{str(dtype).split('.')[-1] + f' {n}^3':<22}{flops / t_torch / 1e12:>19.2f}"
                  f"{flops / t_jax / 1e12:>17.2f}{t_jax / t_torch:>11.2f}{diff.abs().max().item():>12.2e}")


if __name__ == "__main__":
    main()
