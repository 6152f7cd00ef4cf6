"""The conformance run's op tables: random ops, ops with tied indices, exclusions, the CI subset."""
from __future__ import annotations

# Ops whose outputs are random or uninitialised memory: only shapes/dtypes are compared.
NONDETERMINISTIC = {
    "bernoulli": "random",
    "multinomial": "random",
    "normal": "random",
    "normal.number_mean": "random",
    "normal.in_place": "random",
    "uniform": "random",
    "rand_like": "random",
    "randn_like": "random",
    "randint_like": "random",
    "randint": "random",
    "randn": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.rrelu": "random (training-mode slopes)",
    # the pooling regions come from torch.rand on the input's device inside F.fractional_max_pool*d
    "nn.functional.fractional_max_pool2d": "random (pooling regions drawn inside the op)",
    "nn.functional.fractional_max_pool3d": "random (pooling regions drawn inside the op)",
    "svd_lowrank": "random (random projection)",
    "pca_lowrank": "random (random projection)",
    "empty": "uninitialised memory",
    "empty_like": "uninitialised memory",
    "empty_strided": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
    "new_empty": "uninitialised memory",
    "new_empty_strided": "uninitialised memory",
}

# Samples that are random although the op is not (dropout inside the op): shapes/dtypes only.
def _mha_dropout(sample) -> bool:
    # multi_head_attention_forward(query, key, value, embed_dim, num_heads, in_proj_weight, in_proj_bias,
    #     bias_k, bias_v, add_zero_attn, dropout_p, ..., training=True): dropout only when training
    dropout_p = sample.kwargs.get("dropout_p", sample.args[9] if len(sample.args) > 9 else 0.0)
    training = sample.kwargs.get("training", sample.args[12] if len(sample.args) > 12 else True)
    return bool(dropout_p) and bool(training)


_RANDOM_SAMPLES = {
    "nn.functional.scaled_dot_product_attention": lambda s: bool(s.kwargs.get("dropout_p", 0.0)),
    "nn.functional.multi_head_attention_forward": _mha_dropout,
}


def random_sample(key: str, sample) -> bool:
    test = _RANDOM_SAMPLES.get(key)
    return bool(test and test(sample))


# Ops returning indices of equal elements (ties) in an unspecified order: an index output that differs
# from CPU's still passes if it selects the same values. op -> (position of `dim` in args, default dim).
INDEX_TIES = {
    "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1),
    "mode": (0, -1), "median": (0, None), "nanmedian": (0, None), "max.reduction_with_dim": (0, None),
    "min.reduction_with_dim": (0, None), "argmax": (0, None), "argmin": (0, None),
}

# Ops not run at all: CPU-specific / layout-specific / not meaningful on a device.
EXCLUDED = {
    "to_sparse": "sparse layouts are not supported on tpu (dense device only)",
    "sparse.sampled_addmm": "sparse layouts are not supported on tpu",
    "sparse.mm.reduce": "sparse layouts are not supported on tpu",
    "nn.functional.ctc_loss": "CPU/CUDA-specific kernel with no device-generic semantics to compare",
    "_segment_reduce.lengths": "experimental CPU/CUDA-only op",
    "_segment_reduce.offsets": "experimental CPU/CUDA-only op",
}
# any OpInfo whose name starts with one of these is excluded with the given reason
EXCLUDED_PREFIXES = {
    "jiterator_": "CUDA-only jiterator kernels",
    "sparse.": "sparse layouts are not supported on tpu",
    "_refs.": "python references, not ops",
}

# The fixed CI subset: representative ops of every family (elementwise, reductions, matmul, conv,
# norms, softmax, losses, indexing, shape ops). Chosen to run in a few minutes on 2 CPU cores.
CI_SUBSET = (
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "neg", "abs", "exp", "log",
    "sqrt", "sin", "tanh", "sigmoid", "pow", "maximum", "minimum", "clamp", "where", "eq",
    "lt", "logical_and", "bitwise_and", "remainder", "floor", "sign", "erf", "isnan", "nan_to_num",
    "addcmul",
    # reductions
    "sum", "mean", "amax", "argmax", "max.reduction_with_dim", "prod", "var", "std", "cumsum",
    "logsumexp", "all", "any",
    # linalg / matmul / conv / attention
    "mm", "bmm", "matmul", "addmm", "linalg.vector_norm", "nn.functional.linear",
    "nn.functional.conv2d", "nn.functional.conv1d", "nn.functional.scaled_dot_product_attention",
    # norms / activations / softmax
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "softmax", "log_softmax",
    "nn.functional.embedding",
    # losses
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.l1_loss",
    # indexing
    "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "masked_fill",
    "take_along_dim", "__getitem__", "nonzero", "masked_select",
    # shape ops
    "cat", "stack", "reshape", "view", "permute", "transpose", "expand", "squeeze", "unsqueeze",
    "flatten", "split", "flip", "roll", "repeat", "t", "contiguous", "tril",
    "zeros_like", "arange", "sort", "topk",
)

