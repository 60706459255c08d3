"""The zoo at the sizes of the HiRemate paper's broad study (its Table 3).

The paper partitions and solves ten models of very different shapes and sizes. To compare
H-Partition's figures with the paper's, or to run a solver on graphs of the sizes the paper
reports, we need zoo settings whose forward graphs are about as large. Each entry of
:data:`PAPER_MODELS` names a zoo model and its depth (chosen so that our forward graph is
within half to twice the paper's size) and keeps the paper's forward-node figure beside it.
Widths and batches stay small: the graph's node count depends on the depth only, and the
tests and benchmarks that use these settings must run on a small CPU.

How the depths were chosen: the model's published depth where our graph then lands within the
band: GPT 24 and 96 layers and Transformer 6-6 and 36-36 (the depths the paper gives), the
original UNet's four levels, Mixer-B's twelve blocks, the FNO paper's four Fourier layers (the
paper does not give these models' depths). For ResNet-101 and RegNet32 our graphs
have more forward nodes per block than the paper's, so their published stage depths would land
above twice the paper's size; their stage depths are halved (rounded up), which keeps the
proportions of the stages. Measured sizes: docs/graphs.md, "Zoo at the paper's sizes".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hiremate.errors import ConfigError
from hiremate.zoo.registry import Sample, get

#: The paper's Table 3(b) columns: depth, subgraphs, unique subgraphs, largest subgraph.
PartitionFigures = tuple[int, int, int, int]


@dataclass(frozen=True)
class PaperModel:
    """One model of the paper's broad study and the zoo setting that stands for it.

    ``paper_fwd_nodes`` is the paper's Table 3(a) "size fwd only" (forward nodes after
    simplification); ``paper_partition`` its Table 3(b) row. ``note`` says how the setting
    relates to the paper's model.
    """

    paper_name: str
    zoo_name: str
    layers: int | tuple[int, ...]
    width: int
    batch: int
    paper_fwd_nodes: int
    paper_partition: PartitionFigures
    note: str


PAPER_MODELS: dict[str, PaperModel] = {m.paper_name: m for m in (
    PaperModel("gpt-24", "gpt2", 24, 64, 2, 367, (3, 28, 8, 15),
               "GPT-2 medium's 24 layers"),
    PaperModel("gpt-96", "gpt2", 96, 64, 2, 1447, (4, 61, 21, 10),
               "the paper's largest GPT, 96 layers"),
    # batch 16, not 2: at batch 2 the bottleneck's 3x3 weights (576 KiB) outweigh its
    # activations, and a CPU convolution copies its weights into a scratch buffer of their size
    # (35% of the autodiff peak), a regime the paper's full-size images never reach
    PaperModel("unet", "unet", 4, 8, 16, 50, (2, 9, 9, 15),
               "the original UNet's 4 levels, batch 16 (activations outweigh weights)"),
    PaperModel("mlpmixer", "mlpmixer", 12, 32, 2, 125, (2, 15, 6, 10),
               "Mixer-B's 12 blocks"),
    PaperModel("regnet32", "regnet", (1, 3, 6, 1), 16, 2, 173, (2, 15, 10, 15),
               "RegNetY-32GF's stage depths (2, 5, 12, 1) halved"),
    PaperModel("resnet101", "resnet", (2, 2, 12, 2), 8, 2, 211, (2, 19, 10, 15),
               "ResNet-101's stage depths (3, 4, 23, 3) halved"),
    PaperModel("transformer-6-6", "transformer", 6, 32, 2, 224, (3, 23, 20, 17),
               "6 encoder and 6 decoder layers"),
    PaperModel("transformer-36-36", "transformer", 36, 32, 2, 1334, (16, 128, 67, 19),
               "36 encoder and 36 decoder layers"),
    PaperModel("fno1d", "fno1d", 4, 16, 4, 42, (2, 10, 5, 8),
               "the FNO paper's 4 Fourier layers"),
    PaperModel("fno3d", "fno3d", 4, 8, 2, 64, (2, 12, 12, 10),
               "the FNO paper's 4 Fourier layers"),
)}


def paper_models() -> dict[str, PaperModel]:
    """The paper's models by name, in the order of the paper's Table 3 (a copy)."""
    return dict(PAPER_MODELS)


def paper_model(name: str) -> PaperModel:
    """The :class:`PaperModel` of ``name``; raises :class:`ConfigError` for an unknown name."""
    try:
        return PAPER_MODELS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown paper model {name!r}; valid names are: {', '.join(PAPER_MODELS)}"
        ) from None


def get_paper(name: str, dtype: torch.dtype | None = None) -> tuple[torch.nn.Module, Sample]:
    """Build the zoo setting that stands for the paper's model ``name`` (see :func:`get`)."""
    m = paper_model(name)
    return get(m.zoo_name, layers=m.layers, width=m.width, batch=m.batch, dtype=dtype)
