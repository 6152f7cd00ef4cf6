"""Device random numbers: a counter-based JAX PRNG per device, seeded by ``torch.manual_seed``.

Design: the generator holds a base key (from the seed) and a counter. Every random op draws
``fold_in(base_key, counter)`` and increments the counter, so a sequence of random ops after
``torch.manual_seed(s)`` is reproducible run to run, and ``get_rng_state``/``set_rng_state`` is just
(seed, counter). Values differ from CPU PyTorch's Mersenne Twister stream (as CUDA's do); to get
bit-identical CPU numbers pass an explicit CPU ``generator=``: that op then draws on the CPU with it
and copies the result to the device.
"""
from __future__ import annotations

import threading

import jax
import torch

from . import op_jit

_DEFAULT_SEED = 67280421310721  # torch's own default CPU seed


class TPUGenerator:
    def __init__(self, seed: int = _DEFAULT_SEED):
        self._lock = threading.Lock()
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "TPUGenerator":
        seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        with self._lock:
            self._seed = seed
            self._base = jax.random.key(seed & 0x7FFF_FFFF_FFFF_FFFF)
            self._counter = 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def next_key(self) -> jax.Array:
        if op_jit.tracing[0]:  # a key drawn while tracing would be baked into the program: run eagerly
            raise op_jit.NeedsEager("draws from the device generator")
        with self._lock:
            counter = self._counter
            self._counter += 1
        return jax.random.fold_in(self._base, counter)

    def get_state(self) -> torch.Tensor:
        return torch.tensor([self._seed, self._counter], dtype=torch.uint64)

    def set_state(self, state: torch.Tensor) -> None:
        seed, counter = (int(v) for v in state.tolist())
        self.manual_seed(seed)
        self._counter = counter


default_generator = TPUGenerator()
