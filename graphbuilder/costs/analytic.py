"""What an op does, counted from its shapes alone: FLOPs, bytes moved, and its class.

These counts feed the two deterministic cost models: ``flops`` (fixed machine constants, the
same on every machine: for comparisons between solvers and with the papers) and ``roofline``
(per-class coefficients fitted on this machine, :mod:`hiremate.graphbuilder.costs.roofline`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from hiremate.graphbuilder.opinfo import op_kind, schema_name

#: op classes of the roofline model; ``getitem`` is free and belongs to none.
#: ``conv_pointwise``: 1x1 convolutions with unit stride, no padding and one group, which run
#: as one matrix product (no unfolding, no per-group loop), so their fixed cost is far below
#: a general convolution's; ``batch_norm``: batch statistics and their backward (several
#: passes, per-channel loops); ``norm``: the other normalisations and softmax backwards;
#: ``reduce``: sums, means and extrema (one pass, a small output); ``view``: ops that allocate
#: nothing, whose time is the dispatch alone; ``fft``: discrete Fourier transforms (log n passes
#: over their data, a per-element cost of their own); ``random``: random draws (dropout's mask),
#: whose generator costs per element far more than a copy does; the activations and softmaxes
#: of :data:`CALIBRATED_ELEMENTWISE`, each a class of its own, and ``transcendental``, the other
#: elementwise ops that evaluate an exponential, logarithm, trigonometric or error function per
#: element: compute-bound on a CPU, where ``memory`` ops are not, and far apart from one another
#: (docs/benchmarks.md, "Activations, softmaxes and random draws priced")
CALIBRATED_ELEMENTWISE = ("tanh", "exp", "sigmoid", "erf", "gelu", "gelu_backward", "silu",
                          "silu_backward", "_softmax", "_safe_softmax")
OP_CLASSES = ("matmul", "conv", "conv_backward", "conv_pointwise", "conv_pointwise_backward",
              "batch_norm", "norm", "reduce", "fft", "random", "transcendental",
              *CALIBRATED_ELEMENTWISE, "memory", "view")
_MATMULS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")
_REDUCTIONS = ("aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::var",
               "aten::var_mean", "aten::std", "aten::max", "aten::min", "aten::norm")
_FFTS = ("aten::_fft_r2c", "aten::_fft_c2r", "aten::_fft_c2c")
_TRANSCENDENTAL = frozenset(
    f"aten::{name}" for name in (
        "tanh", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sigmoid", "erf",
        "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "gelu", "gelu_backward", "silu", "silu_backward", "mish", "mish_backward", "elu",
        "softplus", "softplus_backward", "logsigmoid", "log_sigmoid_forward",
        "_softmax", "_safe_softmax", "_log_softmax", "softmax", "log_softmax"))
_RANDOM = frozenset(
    f"aten::{name}" for name in (
        "bernoulli", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
        "normal", "uniform", "exponential", "native_dropout", "randperm", "multinomial"))
#: the ``flops`` model's fixed machine (per device kind): FLOP/s, bytes/s, seconds per op
FIXED_MACHINE = {"cpu": (5e10, 1e10, 3e-6), "cuda": (5e13, 1e12, 8e-6)}
#: an attention backward recomputes the scores and forms three gradients: about 2.5 forwards
_ATTENTION_BACKWARD_FACTOR = 2.5


def _numel(v: Any) -> int:
    return v.numel() if isinstance(v, torch.Tensor) else 0


def _name(node: torch.fx.Node) -> str:
    return "getitem" if node.target is operator.getitem else schema_name(node.target)


def _attention_flops(q: Any, k: Any, v: Any) -> float | None:
    """Scores ``q k^T`` and their product with ``v``: 2 FLOPs per multiply-add each."""
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in (q, k, v)):
        return None
    batch = q.numel() // (q.shape[-2] * q.shape[-1])
    length, source = q.shape[-2], k.shape[-2]
    return 2.0 * batch * length * source * (q.shape[-1] + v.shape[-1])


def flops_of(node: torch.fx.Node) -> float:
    """Floating-point operations of ``node``: matrix products, convolutions and attention
    counted from their shapes; any other op as one operation per output element."""
    out = node.meta.get("val")
    name = _name(node)
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    if name in _MATMULS:
        a, b = (ins[-2], ins[-1])
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return 2.0 * _numel(out) * a.shape[-1]
    if name == "aten::convolution" and isinstance(ins[1], torch.Tensor):
        w = ins[1]
        return 2.0 * _numel(out) * (w.numel() // max(w.shape[0], 1))
    if name == "aten::convolution_backward" and len(ins) > 2 and isinstance(ins[2], torch.Tensor):
        w = ins[2]
        return 4.0 * _numel(ins[0]) * (w.numel() // max(w.shape[0], 1))
    if name.startswith("aten::_scaled_dot_product"):
        backward = name.endswith("_backward")
        qkv = ins[1:4] if backward else ins[0:3]
        count = _attention_flops(*qkv) if len(qkv) == 3 else None
        if count is not None:
            return count * (_ATTENTION_BACKWARD_FACTOR if backward else 1.0)
    return float(sum(_numel(v) for v in pytree.tree_leaves(out)))


def bytes_moved(node: torch.fx.Node) -> float:
    """Bytes the op reads and writes at least once: its tensor inputs and outputs."""
    outs = [v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    ins = [a.meta.get("val") for a in node.all_input_nodes]
    return float(sum(v.numel() * v.element_size() for v in outs)
                 + sum(v.numel() * v.element_size() for v in ins if isinstance(v, torch.Tensor)))


def op_class(node: torch.fx.Node) -> str | None:
    """The roofline class of ``node``, or None for ``getitem`` (no op at all)."""
    if node.target is operator.getitem:
        return None
    if op_kind(node.target).view_of is not None:
        return "view"
    name = _name(node)
    if name in _MATMULS or name.startswith("aten::_scaled_dot_product"):
        return "matmul"
    if name in _FFTS:
        return "fft"
    if name == "aten::convolution":
        return "conv_pointwise" if _pointwise(node, 1, 3) else "conv"
    if name == "aten::convolution_backward":
        return "conv_pointwise_backward" if _pointwise(node, 2, 4) else "conv_backward"
    # an in-place variant (``bernoulli_``) costs what the op does
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if base in _RANDOM:
        return "random"
    if base in _TRANSCENDENTAL:
        short = base.removeprefix("aten::")
        return short if short in CALIBRATED_ELEMENTWISE else "transcendental"
    if "batch_norm" in name:
        return "batch_norm"
    if "norm" in name or "softmax" in name:
        return "norm"
    if name in _REDUCTIONS:
        return "reduce"
    return "memory"


def _pointwise(node: torch.fx.Node, weight_at: int, stride_at: int) -> bool:
    """Whether a convolution (or its backward) whose weight is argument ``weight_at`` and whose
    stride, padding, dilation, transposed flag, output padding and groups follow from
    ``stride_at`` is a 1x1 convolution with unit stride, no padding and one group."""
    args = node.args
    if len(args) < stride_at + 6:
        return False
    weight = args[weight_at].meta.get("val") if isinstance(args[weight_at], torch.fx.Node) else None
    stride, padding, _, transposed, _, groups = args[stride_at:stride_at + 6]
    return (isinstance(weight, torch.Tensor) and all(k == 1 for k in weight.shape[2:])
            and all(s == 1 for s in stride) and all(p == 0 for p in padding)
            and not transposed and groups == 1)


def device_kind(node: torch.fx.Node) -> str:
    """``"cuda"`` when the op's first tensor output lives on a GPU, else ``"cpu"``."""
    for v in pytree.tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            return "cuda" if v.device.type == "cuda" else "cpu"
    return "cpu"


def fixed_machine_time(node: torch.fx.Node, flops: float) -> float:
    """The ``flops`` model: a roofline with the fixed constants of :data:`FIXED_MACHINE`."""
    if op_class(node) in (None, "view"):
        return 0.0
    rate, bandwidth, per_op = FIXED_MACHINE[device_kind(node)]
    return per_op + max(flops / rate, bytes_moved(node) / bandwidth)
