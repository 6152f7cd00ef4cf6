"""Pallas vs XLA, per kernel, on whatever platform JAX finds (runs unchanged on CPU/GPU/TPU).

    python benchmarks/pallas.py [--iters N]

On CPU the Pallas kernels run in interpret mode: the numbers there only prove the script runs.
Each row: ms per call of the jitted XLA reference and of the Pallas kernel, max |difference|.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tpu_interactive.backend import kernels as P  # noqa: E402
A, N = P._attention_mod, P._norms_mod  # the modules (the package re-exports the functions)


def timeit(fn, args, iters):
    jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    for _ in range(iters):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / iters * 1e3, out


def cases(big: bool):
    r = lambda *s, seed=0: jax.random.normal(jax.random.key(seed), s, jnp.float32)  # noqa: E731
    n, b, seq = (2048, 16, 1024) if big else (96, 2, 40)
    x2, y2 = r(n, n + 3, seed=1), r(n + 3, n - 5, seed=2)
    yield "matmul", jax.jit(lambda a, c: jnp.matmul(a, c, precision="highest")), P.matmul, (x2, y2)
    s = r(n * 4, n + 7)
    yield "softmax", jax.jit(lambda a: jax.nn.softmax(a, -1)), jax.jit(lambda a: P.softmax(a, -1)), (s,)
    w, bias = r(n + 7, seed=3), r(n + 7, seed=4)
    yield ("layer_norm", jax.jit(lambda a, ww, bb: N._reference(a, ww, bb, 1e-5, False, a.dtype)[0]),
           jax.jit(lambda a, ww, bb: P.layer_norm(a, (a.shape[-1],), ww, bb)[0]), (s, w, bias))
    q, k, v = (r(b, 8, seq, 64, seed=i) for i in range(3))
    for causal in (False, True):
        yield (f"attention causal={causal}", jax.jit(lambda a, c, d, cz=causal: A.reference(a, c, d, cz, 0.125)[0]),
               jax.jit(lambda a, c, d, cz=causal: P.attention(a, c, d, cz, 0.125)), (q, k, v))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    platform = P.platform()
    print(f"platform: {platform} ({jax.devices()[0].device_kind}); Pallas interpret mode: {platform == 'cpu'}")
    print(f"{'kernel':<26}{'xla ms':>10}{'pallas ms':>11}{'xla/pallas':>12}{'max |diff|':>12}")
    iters = args.iters if platform != "cpu" else 2
    for name, xla_fn, pallas_fn, inputs in cases(big=platform != "cpu"):
        t_xla, ref = timeit(xla_fn, inputs, iters)
        t_pallas, out = timeit(pallas_fn, inputs, iters)
        diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
        print(f"{name:<26}{t_xla:>10.3f}{t_pallas:>11.3f}{t_xla / t_pallas:>12.2f}{diff:>12.2e}")


if __name__ == "__main__":
    main()
