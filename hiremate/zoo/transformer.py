"""``transformer``: ``torch.nn.Transformer``, an encoder-decoder with two joining chains.

Its graph is not a single chain: the encoder's output feeds the cross-attention of every
decoder layer, which is the shape the join-network and hierarchical solvers are for. The module
is returned as is (no wrapper), called with ``(src, tgt)``, both already embedded.
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register

HEADS = 4
SRC_LEN = 16
TGT_LEN = 12


@register(
    "transformer",
    f"torch.nn.Transformer encoder-decoder, batch_first, {HEADS} heads, no dropout",
    defaults={"layers": 2, "width": 32, "batch": 2},
    meaning={
        "layers": "number of encoder layers, and as many decoder layers",
        "width": f"model dimension d_model ({HEADS} heads, feed-forward 4*width)",
        "batch": f"batch size (source of {SRC_LEN}, target of {TGT_LEN} positions)",
    },
    width_multiple=HEADS,
)
def build_transformer(
    layers: int, width: int, batch: int
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    model = nn.Transformer(
        d_model=width,
        nhead=HEADS,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        dim_feedforward=4 * width,
        dropout=0.0,
        batch_first=True,
    )
    src = torch.randn(batch, SRC_LEN, width)
    tgt = torch.randn(batch, TGT_LEN, width)
    return model, (src, tgt)
