"""``regnet``: a RegNetY-style network (Radosavovic et al., 2020), written in plain torch.nn.

Each block is RegNet's X block (1x1 conv, 3x3 group convolution of fixed group width, 1x1 conv,
each with BatchNorm, and a residual) with a squeeze-and-excitation gate after the group
convolution, as in RegNetY. The gate multiplies the whole feature map by a per-channel
vector computed from that same map, a fan-out/fan-in that a pure chain does not have. Stage
widths double from ``width``; the design space's quantised linear widths are not reproduced.
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register
from hiremate.zoo.resnet import conv_bn, stage_depths

GROUP_WIDTH = 8
SE_RATIO = 0.25
IMAGE = 32
NUM_CLASSES = 10


class SqueezeExcite(nn.Module):
    """``x * sigmoid(fc(relu(fc(mean(x)))))``, with 1x1 convolutions as the fcs."""

    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.relu = nn.ReLU()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * self.gate(self.expand(self.relu(self.reduce(s))))


class RegNetBlock(nn.Module):
    """1x1 conv, 3x3 group conv (stride here), SE, 1x1 conv; residual (projected if needed)."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int, se_ratio: float):
        super().__init__()
        groups = max(1, cout // group_width)
        self.a = conv_bn(cin, cout, 1)
        self.b = conv_bn(cout, cout, 3, stride=stride, groups=groups)
        self.se: nn.Module = (
            SqueezeExcite(cout, max(1, int(round(cin * se_ratio)))) if se_ratio > 0
            else nn.Identity()
        )
        self.c = conv_bn(cout, cout, 1)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = (
            conv_bn(cin, cout, 1, stride=stride) if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.a(x))
        y = self.se(self.relu(self.b(y)))
        y = self.c(y)
        return self.relu(y + self.shortcut(x))


class RegNet(nn.Module):
    """3x3 stem (stride 1 for small images), four stages of RegNet blocks, pooling, head."""

    def __init__(self, depths: tuple[int, ...], width: int, group_width: int = GROUP_WIDTH,
                 se_ratio: float = SE_RATIO, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, width, 3), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for stage, depth in enumerate(depths):
            cout = width * 2**stage
            for i in range(depth):
                stride = 2 if i == 0 and stage > 0 else 1
                blocks.append(RegNetBlock(cin, cout, stride, group_width, se_ratio))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))
        return self.head(x.mean(dim=(2, 3)))


@register(
    "regnet",
    f"RegNetY-style: group convolutions (group width {GROUP_WIDTH}) with squeeze-excitation",
    defaults={"layers": 1, "width": 16, "batch": 2},
    meaning={
        "layers": "blocks per stage (int, or a tuple of 4 stage depths)",
        "width": f"first stage's channels (doubles per stage; multiple of {GROUP_WIDTH})",
        "batch": f"batch size (3x{IMAGE}x{IMAGE} images)",
    },
    stage_layers=True,
    width_multiple=GROUP_WIDTH,
)
def build_regnet(
    layers: int | tuple[int, ...], width: int, batch: int
) -> tuple[nn.Module, torch.Tensor]:
    model = RegNet(stage_depths("regnet", layers), width)
    return model, torch.randn(batch, 3, IMAGE, IMAGE)
