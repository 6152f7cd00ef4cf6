"""Sample arguments for every op of CUDA's autocast policy lists (a data table for test_amp_optim.py).

``SAMPLES[name](f)`` returns the positional arguments of aten overload ``name``; ``f(*shape)`` makes a
floating CPU tensor (values in (0.1, 0.9), so log/acos/erfinv/... are defined). Integer and boolean
arguments (targets, indices, flags) are literal. The test decides the dtypes.
"""
from __future__ import annotations

import torch


def _long(*values):
    return torch.tensor(values, dtype=torch.long)


def _sign(f, *shape):
    return (f(*shape) > 0.5).float() * 2 - 1


_UNARY = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
          "rsqrt", "sinh", "tan", "softplus")
_PAIR_LOSSES = ("l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "kl_div", "binary_cross_entropy_with_logits",
                "dist")

SAMPLES: dict = {
    # ---- lower_precision_fp
    "_convolution.deprecated": lambda f: (f(1, 2, 8), f(3, 2, 3), f(3), [1], [0], [1], False, [0], 1, False, False,
                                          True),
    "_convolution": lambda f: (f(1, 2, 8), f(3, 2, 3), f(3), [1], [0], [1], False, [0], 1, False, False, True, True),
    "conv1d": lambda f: (f(1, 2, 8), f(3, 2, 3), f(3)),
    "conv2d": lambda f: (f(1, 2, 6, 6), f(3, 2, 3, 3), f(3)),
    "conv3d": lambda f: (f(1, 2, 4, 4, 4), f(3, 2, 2, 2, 2), f(3)),
    "conv_tbc": lambda f: (f(6, 2, 3), f(3, 3, 4), f(4), 1),
    "conv_transpose1d": lambda f: (f(1, 2, 8), f(2, 3, 3), f(3)),
    "conv_transpose2d.input": lambda f: (f(1, 2, 5, 5), f(2, 3, 3, 3), f(3)),
    "conv_transpose3d.input": lambda f: (f(1, 2, 3, 3, 3), f(2, 3, 2, 2, 2), f(3)),
    "convolution": lambda f: (f(1, 2, 6, 6), f(3, 2, 3, 3), f(3), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    "prelu": lambda f: (f(2, 3, 4), f(3)),
    "addmm": lambda f: (f(2, 4), f(2, 3), f(3, 4)),
    "addmv": lambda f: (f(2), f(2, 3), f(3)),
    "addr": lambda f: (f(2, 3), f(2), f(3)),
    "matmul": lambda f: (f(2, 3), f(3, 4)),
    "einsum": lambda f: ("ij,jk->ik", [f(2, 3), f(3, 4)]),
    "mm": lambda f: (f(2, 3), f(3, 4)),
    "mv": lambda f: (f(2, 3), f(3)),
    "linalg_vecdot": lambda f: (f(2, 3), f(2, 3)),
    "linear": lambda f: (f(2, 3), f(4, 3), f(4)),
    "addbmm": lambda f: (f(2, 4), f(5, 2, 3), f(5, 3, 4)),
    "baddbmm": lambda f: (f(5, 2, 4), f(5, 2, 3), f(5, 3, 4)),
    "bmm": lambda f: (f(5, 2, 3), f(5, 3, 4)),
    "chain_matmul": lambda f: ([f(2, 3), f(3, 4), f(4, 2)],),
    "linalg_multi_dot": lambda f: ([f(2, 3), f(3, 4), f(4, 2)],),
    "_thnn_fused_lstm_cell": lambda f: (f(2, 16), f(2, 16), f(2, 4), f(16), f(16)),
    "_thnn_fused_gru_cell": lambda f: (f(2, 12), f(2, 12), f(2, 4), f(12), f(12)),
    "lstm_cell": lambda f: (f(2, 3), [f(2, 4), f(2, 4)], f(16, 3), f(16, 4), f(16), f(16)),
    "gru_cell": lambda f: (f(2, 3), f(2, 4), f(12, 3), f(12, 4), f(12), f(12)),
    "rnn_tanh_cell": lambda f: (f(2, 3), f(2, 4), f(4, 3), f(4, 4), f(4), f(4)),
    "rnn_relu_cell": lambda f: (f(2, 3), f(2, 4), f(4, 3), f(4, 4), f(4), f(4)),
    "_scaled_dot_product_flash_attention": lambda f: (f(1, 2, 4, 8), f(1, 2, 4, 8), f(1, 2, 4, 8)),
    "scaled_dot_product_attention": lambda f: (f(1, 2, 4, 8), f(1, 2, 4, 8), f(1, 2, 4, 8)),
    "cudnn_convolution": lambda f: (f(1, 2, 6, 6), f(3, 2, 3, 3), [0, 0], [1, 1], [1, 1], 1, False, False, True),
    "cudnn_convolution_transpose": lambda f: (f(1, 2, 5, 5), f(2, 3, 3, 3), [0, 0], [0, 0], [1, 1], [1, 1], 1,
                                              False, False, True),
    # ---- fp32
    **{name: (lambda f: (f(3, 4),)) for name in _UNARY},
    "pow.Tensor_Scalar": lambda f: (f(3, 4), 2),
    "pow.Tensor_Tensor": lambda f: (f(3, 4), f(3, 4)),
    "pow.Scalar": lambda f: (2, f(3, 4)),
    "layer_norm": lambda f: (f(2, 4), [4], f(4), f(4)),
    "native_layer_norm": lambda f: (f(2, 4), [4], f(4), f(4), 1e-5),
    "rms_norm": lambda f: (f(2, 4), [4], f(4)),
    "group_norm": lambda f: (f(2, 4, 3), 2, f(4), f(4)),
    "frobenius_norm.dim": lambda f: (f(3, 4), [0, 1]),
    "nuclear_norm": lambda f: (f(3, 4),),
    "nuclear_norm.dim": lambda f: (f(3, 4), [0, 1]),
    "cosine_similarity": lambda f: (f(2, 4), f(2, 4)),
    "poisson_nll_loss": lambda f: (f(2, 4), f(2, 4), True, False, 1e-8, 1),
    "cosine_embedding_loss": lambda f: (f(2, 4), f(2, 4), _sign(f, 2)),
    "nll_loss": lambda f: (f(3, 5).log(), _long(0, 4, 2)),
    "nll_loss2d": lambda f: (f(2, 3, 2, 2).log(), _long(0, 1, 2, 1, 0, 0, 2, 1).reshape(2, 2, 2)),
    "hinge_embedding_loss": lambda f: (f(2, 4), _sign(f, 2, 4)),
    **{name: (lambda f: (f(2, 4), f(2, 4))) for name in _PAIR_LOSSES},
    "margin_ranking_loss": lambda f: (f(4), f(4), _sign(f, 4)),
    "multilabel_margin_loss": lambda f: (f(2, 4), _long(3, 0, -1, 1, 1, 2, -1, 0).reshape(2, 4)),
    "soft_margin_loss": lambda f: (f(2, 4), _sign(f, 2, 4)),
    "triplet_margin_loss": lambda f: (f(2, 4), f(2, 4), f(2, 4)),
    "multi_margin_loss": lambda f: (f(2, 4), _long(1, 3)),
    "pdist": lambda f: (f(4, 3),),
    "cdist": lambda f: (f(3, 4), f(5, 4)),
    "renorm": lambda f: (f(3, 4), 2, 0, 1.0),
    "logsumexp": lambda f: (f(3, 4), [1]),
    "upsample_nearest1d": lambda f: (f(1, 2, 4), [8]),
    "_upsample_nearest_exact1d": lambda f: (f(1, 2, 4), [8]),
    "upsample_nearest2d": lambda f: (f(1, 2, 3, 3), [6, 6]),
    "_upsample_nearest_exact2d": lambda f: (f(1, 2, 3, 3), [6, 6]),
    "upsample_nearest3d": lambda f: (f(1, 1, 2, 2, 2), [4, 4, 4]),
    "_upsample_nearest_exact3d": lambda f: (f(1, 1, 2, 2, 2), [4, 4, 4]),
    "upsample_linear1d": lambda f: (f(1, 2, 4), [8], False),
    "upsample_bilinear2d": lambda f: (f(1, 2, 3, 3), [6, 6], False),
    "_upsample_bilinear2d_aa": lambda f: (f(1, 2, 3, 3), [6, 6], False),
    "upsample_trilinear3d": lambda f: (f(1, 1, 2, 2, 2), [4, 4, 4], False),
    "upsample_bicubic2d": lambda f: (f(1, 2, 3, 3), [6, 6], False),
    "_upsample_bicubic2d_aa": lambda f: (f(1, 2, 3, 3), [6, 6], False),
    # ---- fp32_set_opt_dtype
    "prod": lambda f: (f(3, 4),),
    "prod.dim_int": lambda f: (f(3, 4), 1),
    "softmax.int": lambda f: (f(3, 4), 1),
    "log_softmax.int": lambda f: (f(3, 4), 1),
    "cumprod": lambda f: (f(3, 4), 1),
    "cumsum": lambda f: (f(3, 4), 1),
    "linalg_vector_norm": lambda f: (f(3, 4),),
    "linalg_matrix_norm": lambda f: (f(3, 4), 1),
    "linalg_matrix_norm.str_ord": lambda f: (f(3, 4),),
    "sum": lambda f: (f(3, 4),),
    "sum.dim_IntList": lambda f: (f(3, 4), [1]),
    # ---- fp32_append_dtype
    "norm.Scalar": lambda f: (f(3, 4), 2),
    "norm.ScalarOpt_dim": lambda f: (f(3, 4), 2, [1], False),
    # ---- promote
    "addcdiv": lambda f: (f(3, 4), f(3, 4), f(3, 4)),
    "addcmul": lambda f: (f(3, 4), f(3, 4), f(3, 4)),
    "atan2": lambda f: (f(3, 4), f(3, 4)),
    "bilinear": lambda f: (f(2, 3), f(2, 4), f(5, 3, 4), f(5)),
    "cross": lambda f: (f(2, 3), f(2, 3)),
    "dot": lambda f: (f(3), f(3)),
    "vdot": lambda f: (f(3), f(3)),
    "grid_sampler": lambda f: (f(1, 1, 4, 4), f(1, 3, 3, 2) * 2 - 1, 0, 0, False),
    "index_put": lambda f: (f(5), [_long(1, 3)], f(2)),
    "tensordot": lambda f: (f(2, 3), f(3, 4), [1], [0]),
    "scatter_add": lambda f: (f(3, 4), 0, _long(0, 2, 1, 0, 1, 1, 2, 0).reshape(2, 4), f(2, 4)),
    # ---- banned
    "binary_cross_entropy": lambda f: (f(2, 4), f(2, 4)),
}

# Ops that cannot run here, with the reason. Their cast is still checked: the input dtypes of the first
# op that reaches the backend are recorded by a dispatch mode.
CAST_ONLY: dict[str, str] = {
    # lowered (nn.LSTMCell/GRUCell reach them through lstm_cell/gru_cell, checked against CPU there)
    # but CPU has no kernel of its own to compare a direct call with
    "_thnn_fused_lstm_cell": "fused RNN cell kernel with no CPU kernel to compare against",
    "_thnn_fused_gru_cell": "fused RNN cell kernel with no CPU kernel to compare against",
    "_scaled_dot_product_flash_attention": "CUDA flash-attention kernel (CPU has a separate _for_cpu op)",
    "cudnn_convolution": "cuDNN kernel",
    "cudnn_convolution_transpose": "cuDNN kernel",
}
