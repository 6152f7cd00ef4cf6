"""RNG ops: draw from the device generator (rng.py); an explicit CPU generator draws on the CPU."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .. import dtypes, storage
from ..dispatch import cpu_to_jax
from ..registry import lower
from ._common import compute_dtype, outside_unit_interval, value_checked
from ..rng import is_cpu_generator, next_key


def _host_tensors_refused(fn):
    """A cpu tensor reaches these kernels only when ``generator=`` is a tpu generator (the dispatcher
    picks the generator's backend): refuse as torch's CPU kernels refuse a CUDA generator."""
    @functools.wraps(fn)
    def kernel(*args, generator=None, **kwargs):
        if generator is not None and generator.device.type == "tpu":
            tensors = [a for a in (*args, kwargs.get("out")) if isinstance(a, torch.Tensor)]
            if tensors and all(t.device.type == "cpu" for t in tensors):
                raise RuntimeError("Expected a 'cpu' device type for generator but found 'tpu'")
        return fn(*args, generator=generator, **kwargs)

    return kernel


def _bucket(n: int) -> int:
    """Random kernels compile once per shape (about a second each on CPU): draw a power-of-two
    bucket of numbers and slice, so a model's many parameter shapes share a few compiled kernels."""
    if n > 1 << 24:
        return n
    return max(256, 1 << (n - 1).bit_length())


def _draw(sampler, shape, dtype, generator=None, **kwargs):
    n = math.prod(shape)
    flat = sampler(next_key(generator), (_bucket(n),), dtype, **kwargs)
    return flat[:n].reshape(shape)


def _on_cpu(self, generator, draw):
    """Draw with an explicit CPU torch.Generator (bit-identical to CPU), then store on device."""
    host = torch.empty(self.shape, dtype=self.dtype)
    draw(host)
    storage.write(self, cpu_to_jax(host))
    return self


def _float_dtype(self):
    dtype = dtypes.to_jax(self.dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise RuntimeError(f"expected a floating point tensor for this random op, got {self.dtype}")
    return dtype


def _write_real_draw(self, generator, sampler, transform, **kwargs):
    """Write ``transform(draw)`` into self; a complex tensor draws its (real, imag) pairs, as CPU
    PyTorch fills ``view_as_real(self)``."""
    complex_ = self.dtype.is_complex
    real = self.dtype.to_real() if complex_ else self.dtype
    if not real.is_floating_point:
        raise RuntimeError(f"expected a floating point tensor for this random op, got {self.dtype}")
    compute = jnp.float64 if real == torch.float64 else jnp.float32
    shape = (*self.shape, 2) if complex_ else tuple(self.shape)
    value = transform(_draw(sampler, shape, compute, generator, **kwargs))
    if complex_:
        value = jax.lax.complex(value[..., 0], value[..., 1])
    storage.write(self, value.astype(dtypes.to_jax(self.dtype)))
    return self


# how CPU's messages name a floating dtype: its C++ type, and its ScalarType
_CPP_TYPES = {torch.float32: ("float", "Float"), torch.float64: ("double", "Double"),
              torch.float16: ("c10::Half", "Half"), torch.bfloat16: ("c10::BFloat16", "BFloat16")}


def _check_uniform_range(dtype: torch.dtype, from_: float, to: float) -> None:
    """CPU's uniform_ checks: both bounds within the dtype's finite range (NaN and inf are not), in order,
    and their difference representable."""
    if dtype not in _CPP_TYPES:
        return  # an integer tensor: torch's uniform_ refuses it before calling the kernel
    cpp, scalar = _CPP_TYPES[dtype]
    finite = torch.finfo(dtype).max
    for name, value in (("from", from_), ("to", to)):
        if not -finite <= value <= finite:
            raise RuntimeError(f"{name} is out of bounds for {cpp}")
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}")
    if to - from_ > finite:
        raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits<{scalar}>::max(), but found to={to:g} "
                           f"and from={from_:g} which result in to-from to exceed the limit")


@lower("uniform_", raw=True)
@_host_tensors_refused
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    _check_uniform_range(self.dtype.to_real() if self.dtype.is_complex else self.dtype, from_, to)
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.uniform_(from_, to, generator=generator))
    return _write_real_draw(self, generator, jax.random.uniform, lambda v: v, minval=from_, maxval=to)


def _check_std(std: float) -> None:
    """CPU's check of normal's float std (NaN fails it), printed as a C++ double."""
    if not std >= 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


@lower("normal_", raw=True)
@_host_tensors_refused
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _check_std(std)
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.normal_(mean, std, generator=generator))
    # a complex normal has variance std**2 in total: std/sqrt(2) per part, as CPU does
    scale = std / math.sqrt(2) if self.dtype.is_complex else std
    return _write_real_draw(self, generator, jax.random.normal, lambda v: v * scale + mean)


def _bernoulli_into(self, p, generator):
    compute = jnp.float64 if self.dtype == torch.float64 else jnp.float32
    u = _draw(jax.random.uniform, self.shape, compute, generator)
    storage.write(self, (u < p).astype(dtypes.to_jax(self.dtype)))
    return self


@lower("bernoulli_.float", raw=True)
@_host_tensors_refused
def bernoulli_float(self, p=0.5, *, generator=None):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.bernoulli_(p, generator=generator))
    return _bernoulli_into(self, p, generator)


@lower("bernoulli_.Tensor", raw=True)
@_host_tensors_refused
def bernoulli_tensor(self, p, *, generator=None):
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.bernoulli_(p.cpu(), generator=generator))
    probs = storage.read(p) if p.device.type == "tpu" else cpu_to_jax(p)
    value_checked(None, (), probs, outside_unit_interval, (), lambda _: _P_OUTSIDE_0_1)
    return _bernoulli_into(self, probs, generator)


# CPU's words (a TORCH_CHECK without a message); CUDA's kernel asserts the same on the device
_P_OUTSIDE_0_1 = ("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  (Could this error message be improved?  "
                  "If so, please report an enhancement request to PyTorch.)")


@lower("bernoulli", raw=True)
@_host_tensors_refused
def bernoulli(self, *, generator=None):
    out = torch.empty_like(self)
    return bernoulli_tensor(out, self, generator=generator)


def _random_range(self, low, high, generator):
    dtype = dtypes.to_jax(self.dtype)
    if self.dtype == torch.bool:
        value = _draw(jax.random.uniform, self.shape, jnp.float32, generator) < 0.5
    elif jnp.issubdtype(dtype, jnp.floating):
        value = jnp.floor(_draw(jax.random.uniform, self.shape, jnp.float64, generator, minval=low, maxval=high))
    else:
        value = _draw(lambda key, shape, dtype: jax.random.randint(key, shape, low, high, dtype), self.shape, jnp.int64,
                      generator)
    storage.write(self, value.astype(dtype))
    return self


@lower("random_.from", raw=True)
@_host_tensors_refused
def random_from(self, from_, to=None, *, generator=None):
    if to is None:
        to = 2 ** min(63, torch.finfo(self.dtype).nmant + 1 if self.dtype.is_floating_point else self.dtype.itemsize * 8 - 1)
    if from_ >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.random_(from_, to, generator=generator))
    return _random_range(self, from_, to, generator)


@lower("random_.to", raw=True)
@_host_tensors_refused
def random_to(self, to, *, generator=None):
    return random_from(self, 0, to, generator=generator)


@lower("random_", raw=True)
@_host_tensors_refused
def random_(self, *, generator=None):
    if self.dtype == torch.bool:
        return _random_range(self, 0, 2, generator)
    high = 2 ** (torch.finfo(self.dtype).nmant + 1) if self.dtype.is_floating_point else \
        (2 ** (self.dtype.itemsize * 8 - 1) if self.dtype != torch.uint8 else 256)
    return random_from(self, 0, high, generator=generator)


@lower("exponential_", raw=True)
@_host_tensors_refused
def exponential_(self, lambd=1.0, *, generator=None):
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.exponential_(lambd, generator=generator))
    dtype = _float_dtype(self)
    value = _draw(jax.random.exponential, self.shape, jnp.float32 if dtype != jnp.float64 else dtype, generator) / lambd
    storage.write(self, value.astype(dtype))
    return self


@lower("randperm.generator_out", raw=True)
@_host_tensors_refused
def randperm_out(n, *, generator=None, out):
    if is_cpu_generator(generator):
        host = torch.randperm(n, generator=generator, dtype=out.dtype)
        value = cpu_to_jax(host)
    else:
        value = jax.random.permutation(next_key(generator), n).astype(dtypes.to_jax(out.dtype))
    if tuple(out.shape) != (n,):
        out.resize_((n,))
    storage.write(out, value)
    return out


@lower("multinomial", raw=True)
@_host_tensors_refused
def multinomial(self, num_samples, replacement=False, *, generator=None):
    if is_cpu_generator(generator):
        host = torch.multinomial(self.cpu(), num_samples, replacement, generator=generator)
        return storage.from_array(cpu_to_jax(host), torch.int64)
    probs = storage.read(self).astype(jnp.float64)
    _check_multinomial(self, probs, num_samples, replacement)
    batched = probs if probs.ndim == 2 else probs[None]
    key = next_key(generator)
    logits = jnp.log(batched)
    if replacement:
        samples = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, batched.shape[0])).T
    else:  # Gumbel top-k: sampling without replacement
        g = jax.random.gumbel(key, batched.shape)
        samples = jax.lax.top_k(logits + g, num_samples)[1]
    samples = samples if probs.ndim == 2 else samples[0]
    return storage.from_array(samples.astype(jnp.int64), torch.int64)


def _check_multinomial(self, probs, num_samples, replacement) -> None:
    """CPU's argument and distribution checks, in CPU's order and words (one host sync)."""
    if probs.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.dtype.is_floating_point:
        raise RuntimeError("multinomial only supports floating-point dtypes for input, got: "
                           f"{dtypes.scalar_name(self.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > probs.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if probs.shape[-1] > 1 << 24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    flat = probs.reshape(-1)
    bad = ~(flat >= 0) | ~jnp.isfinite(flat)  # CPU: per entry, "< 0" (also NaN) before "infinity"
    first = jnp.argmax(bad)
    summary = np.asarray(jnp.stack([jnp.any(bad), flat[first] >= 0,
                                    jnp.any(jnp.sum(jnp.where(bad.reshape(probs.shape), 0, probs), axis=-1) <= 0)]))
    if summary[0] and not replacement:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if summary[0]:
        what = "= infinity or NaN" if summary[1] else "< 0"
        raise RuntimeError(f"invalid multinomial distribution (encountering probability entry {what})")
    if summary[2]:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _fill(self, generator, cpu_draw, sampler):
    """Write ``sampler(compute_dtype)`` (a device draw) into self, or draw on CPU with a CPU generator."""
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, cpu_draw)
    dtype = _float_dtype(self)
    compute = compute_dtype(dtype)
    storage.write(self, sampler(compute).astype(dtype))
    return self


def _check_scale(op: str, name: str, value: float) -> None:
    """CPU's check of a distribution's scale parameter, in its words."""
    if not value > 0:  # NaN fails, as CPU's check
        raise RuntimeError(f"{op} expects {name} > 0.0, but found {name}={value:g}")


@lower("cauchy_", raw=True)
@_host_tensors_refused
def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    _check_scale("cauchy_", "sigma", sigma)
    return _fill(self, generator, lambda h: h.cauchy_(median, sigma, generator=generator),
                 lambda dt: median + sigma * jnp.tan(math.pi * (_draw(jax.random.uniform, self.shape, dt, generator) - 0.5)))


@lower("log_normal_", raw=True)
@_host_tensors_refused
def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    _check_scale("log_normal_", "std", std)
    return _fill(self, generator, lambda h: h.log_normal_(mean, std, generator=generator),
                 lambda dt: jnp.exp(_draw(jax.random.normal, self.shape, dt, generator) * std + mean))


@lower("geometric_", raw=True)
@_host_tensors_refused
def geometric_(self, p, *, generator=None):
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p:g}")
    if is_cpu_generator(generator):
        return _on_cpu(self, generator, lambda h: h.geometric_(p, generator=generator))
    # number of Bernoulli(p) trials to the first success; defined for every dtype, as on CPU
    u = _draw(lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, minval=jnp.finfo(dtype).tiny),
              self.shape, jnp.float64, generator)
    storage.write(self, jnp.ceil(jnp.log(u) / math.log1p(-p)).astype(dtypes.to_jax(self.dtype)))
    return self


def _normal_out(mean, std, generator, shape, dtype):
    """mean + std * N(0, 1) with torch's broadcast shape and result dtype (CPU checks std >= 0)."""
    if isinstance(std, torch.Tensor):
        std_value = storage.read(std)
        if not bool(jnp.all(std_value >= 0)):  # NaN fails, as CPU's check
            raise RuntimeError("normal expects all elements of std >= 0.0")
    else:
        _check_std(std)
        std_value = std
    mean_value = storage.read(mean) if isinstance(mean, torch.Tensor) else mean
    out = torch.empty(shape, dtype=dtype, device="tpu")
    if is_cpu_generator(generator):
        host = torch.normal(mean.cpu() if isinstance(mean, torch.Tensor) else mean,
                            std.cpu() if isinstance(std, torch.Tensor) else std, generator=generator)
        storage.write(out, cpu_to_jax(host))
        return out
    jdtype = _float_dtype(out)
    compute = compute_dtype(jdtype)
    value = _draw(jax.random.normal, tuple(shape), compute, generator) * std_value + mean_value
    storage.write(out, jnp.broadcast_to(value, tuple(shape)).astype(jdtype))
    return out


def _tensor_of(a, b):
    return a if isinstance(a, torch.Tensor) else b


@lower("normal.Tensor_Tensor", "normal.Tensor_float", "normal.float_Tensor", raw=True)
@_host_tensors_refused
def normal(mean, std=1.0, *, generator=None):
    ref = _tensor_of(mean, std)
    if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor):
        shape = torch.broadcast_shapes(mean.shape, std.shape)
        dtype = torch.result_type(mean, std)
    else:
        shape, dtype = ref.shape, ref.dtype
    if not dtype.is_floating_point:
        raise RuntimeError(f"normal expects floating point mean and std, got {dtype}")
    return _normal_out(mean, std, generator, shape, dtype)
