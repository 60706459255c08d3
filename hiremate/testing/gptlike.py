"""Synthetic GPT-like forward graphs, for partitioning tests and benchmarks.

Each transformer layer is about 30 forward ops, shaped like a simplified ATen trace of GPT-2:
layer norm (mean, centring, variance, rsqrt, scale, shift), a QKV projection split in three,
the attention diamond (scores, scaling, mask, softmax, dropout, weighted sum), an output
projection and a residual add, then a second layer norm, an MLP with GELU, and a second
residual add. Reshapes read their input's shape through a soft dependency on the layer input.
Every layer runs the same code on the same shapes, so its nodes are identical from layer to
layer (what identical-subgraph recognition must find).

The same op list can become a bare :class:`ForwardDag` (fast, for 10^5 nodes) or a full
CD-graph through :func:`hiremate.testing.synthetic.graph_from_dag` (for smaller sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hiremate.testing.synthetic import DagOp

from hiremate.partition.dag import ForwardDag


@dataclass
class _Op:
    inputs: list[int]
    size: int
    code: str
    soft: list[int] = field(default_factory=list)
    params: bool = False


class _Builder:
    def __init__(self) -> None:
        self.ops: list[_Op] = []

    def op(self, code: str, inputs: list[int], size: int, soft: list[int] | None = None,
           params: bool = False) -> int:
        self.ops.append(_Op(inputs, size, code, soft or [], params))
        return len(self.ops) - 1


def gpt_like_ops(n_layers: int, batch: int = 4, seq: int = 128, dim: int = 256,
                 heads: int = 4) -> list[_Op]:
    """The op list of an ``n_layers`` GPT-like forward pass (see module docstring)."""
    act = batch * seq * dim * 4
    att = batch * heads * seq * seq * 4
    stat = batch * seq * 4
    b = _Builder()
    tok = b.op("embedding", [-1], act, params=True)
    pos = b.op("embedding_pos", [-1], act, params=True)
    x = b.op("add", [tok, pos], act)
    x = b.op("dropout", [x], act)

    def layer_norm(h: int) -> int:
        mean = b.op("ln_mean", [h], stat)
        cent = b.op("ln_sub", [h, mean], act)
        var = b.op("ln_var", [cent], stat)
        inv = b.op("ln_rsqrt", [var], stat)
        norm = b.op("ln_mul", [cent, inv], act)
        return b.op("ln_affine", [norm], act, params=True)

    for _ in range(n_layers):
        h = layer_norm(x)
        qkv = b.op("addmm_qkv", [h], 3 * act, params=True)
        q = b.op("split_q", [qkv], act)
        k = b.op("split_k", [qkv], act)
        v = b.op("split_v", [qkv], act)
        qh = b.op("view_heads_q", [q], act, soft=[x])
        kh = b.op("transpose_k", [k], act, soft=[x])
        vh = b.op("view_heads_v", [v], act, soft=[x])
        s = b.op("bmm_scores", [qh, kh], att)
        s = b.op("div_scale", [s], att)
        s = b.op("masked_fill", [s], att)
        mx = b.op("amax", [s], att // seq)
        e = b.op("exp_sub", [s, mx], att)
        z = b.op("sum", [e], att // seq)
        p = b.op("softmax_div", [e, z], att)
        p = b.op("dropout_attn", [p], att)
        o = b.op("bmm_values", [p, vh], act)
        o = b.op("merge_heads", [o], act, soft=[x])
        o = b.op("addmm_proj", [o], act, params=True)
        o = b.op("dropout_proj", [o], act)
        x = b.op("residual_add", [x, o], act)
        h = layer_norm(x)
        f = b.op("addmm_fc", [h], 4 * act, params=True)
        g = b.op("gelu", [f], 4 * act)
        f = b.op("addmm_fc_out", [g], act, params=True)
        f = b.op("dropout_mlp", [f], act)
        x = b.op("residual_add", [x, f], act)
    x = layer_norm(x)
    b.op("lm_head", [x], batch * seq * 1000 * 4, params=True)
    return b.ops


def ops_per_layer() -> int:
    return len(gpt_like_ops(2)) - len(gpt_like_ops(1))


def layers_for(n_nodes: int) -> int:
    """Number of layers whose graph has about ``n_nodes`` forward nodes."""
    base = len(gpt_like_ops(0))
    return max(1, round((n_nodes - base) / ops_per_layer()))


def gpt_like_dag(n_layers: int, **shape: int) -> ForwardDag:
    """A bare forward DAG (no Graph), fast enough for 10^5 nodes."""
    ops = gpt_like_ops(n_layers, **shape)
    users: list[list[int]] = [[] for _ in ops]
    preds: list[list[int]] = []
    soft: list[list[int]] = []
    for i, op in enumerate(ops):
        ins = [j for j in op.inputs if j >= 0]
        for j in ins:
            users[j].append(i)
        preds.append(ins)
        soft.append(op.soft)
    values = [(i, op.size, users[i], not users[i]) for i, op in enumerate(ops)]
    return ForwardDag.build(preds, values, [op.code for op in ops], soft_preds=soft)


def gpt_like_dag_ops(n_layers: int, **shape: int) -> list[DagOp]:
    """The same graph as :class:`DagOp` s, for :func:`hiremate.testing.synthetic.graph_from_dag`."""
    out = []
    for op in gpt_like_ops(n_layers, **shape):
        weight = 1.0 + op.size / 1e6
        out.append(DagOp(inputs=list(op.inputs), size=op.size, time=weight,
                         has_param=op.params, saves_inputs=True, saves_output=False,
                         code=op.code, soft_inputs=list(op.soft)))
    return out
