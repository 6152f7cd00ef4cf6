"""Device random numbers: a counter-based JAX PRNG per device, seeded by ``torch.manual_seed``.

Design: the generator holds a base key (from the seed) and a counter. Every random op draws
``fold_in(base_key, counter)`` and increments the counter, so a sequence of random ops after
``torch.manual_seed(s)`` is reproducible run to run, and ``get_rng_state``/``set_rng_state`` is just
(seed, counter). Values differ from CPU PyTorch's Mersenne Twister stream (as CUDA's do); to get
bit-identical CPU numbers pass an explicit CPU ``generator=``: that op then draws on the CPU with it
and copies the result to the device. A ``torch.Generator(device="tpu")`` (a C++ generator from
native.py holding (seed, offset)) draws ``fold_in(key(seed), offset)`` the same way, independently
of the default generator and of every other generator.
"""
from __future__ import annotations

import functools
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
            self._base = _base_key(seed)
            self._counter = 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def next_key(self) -> jax.Array:
        if forced is not None:
            return forced.pop(0)
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


@functools.lru_cache(maxsize=64)
def _base_key(seed: int) -> jax.Array:
    return jax.random.key(seed & 0x7FFF_FFFF_FFFF_FFFF)


# Keys drawn when a fused-mode op was recorded (fusion.py), handed out in order while it runs.
forced: list | None = None
default_generator = TPUGenerator()
_generator_lock = threading.Lock()


def is_cpu_generator(generator: torch.Generator | None) -> bool:
    """An explicit CPU generator: the op draws on the CPU with it (bit-identical to CPU) and copies."""
    return generator is not None and generator.device.type == "cpu"


def next_key(generator: torch.Generator | None = None) -> jax.Array:
    """The key for one random op: from the default generator, or from a tpu ``torch.Generator``
    (whose offset it advances)."""
    if forced is not None:
        return forced.pop(0)
    if generator is None:
        return default_generator.next_key()
    if generator.device.type != "tpu":
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")
    with _generator_lock:
        offset = generator.get_offset()
        generator.set_offset(offset + 1)
        seed = generator.initial_seed()
    return jax.random.fold_in(_base_key(seed), offset)
