"""``resnet``: a ResNet-50/101-style network of Bottleneck blocks, written in plain torch.nn.

Four stages of bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4, each with BatchNorm, and a
projected shortcut where the shape changes), as in He et al. (2016). ReLUs are not in place,
so every activation is a value of its own in the captured graph. BatchNorm is in training mode
as returned, so the captured graph carries its running-statistics updates.

``layers`` is the number of blocks in each stage (an int for all four, or a tuple of four:
``layers=(3, 4, 6, 3), width=64`` is ResNet-50 and ``(3, 4, 23, 3)`` ResNet-101, on 32x32
images with a CIFAR-style stem).
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.errors import ConfigError
from hiremate.zoo.registry import register

EXPANSION = 4
IMAGE = 32
NUM_CLASSES = 10
STAGES = 4


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """Convolution without bias (the BatchNorm has one) followed by BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups,
                  bias=False),
        nn.BatchNorm2d(cout),
    )


class Bottleneck(nn.Module):
    """``relu(shortcut(x) + bn(conv1x1(relu(bn(conv3x3(relu(bn(conv1x1(x)))))))))``."""

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        cout = planes * EXPANSION
        self.reduce = conv_bn(cin, planes, 1)
        self.conv = conv_bn(planes, planes, 3, stride=stride)
        self.expand = conv_bn(planes, cout, 1)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = (
            conv_bn(cin, cout, 1, stride=stride) if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.reduce(x))
        y = self.relu(self.conv(y))
        y = self.expand(y)
        return self.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """3x3 stem, four stages of bottlenecks (stride 2 from the second), pooling, linear head."""

    def __init__(self, depths: tuple[int, ...], width: int, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, width, 3), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for stage, depth in enumerate(depths):
            planes = width * 2**stage
            for i in range(depth):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(cin, planes, stride))
                cin = planes * EXPANSION
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))
        return self.head(x.mean(dim=(2, 3)))


def stage_depths(name: str, layers: int | tuple[int, ...]) -> tuple[int, ...]:
    """``layers`` as one depth per stage; raises :class:`ConfigError` on a wrong length."""
    if isinstance(layers, int):
        return (layers,) * STAGES
    if len(layers) != STAGES:
        raise ConfigError(
            f"zoo model {name!r}: layers must be an int or a tuple of {STAGES} stage depths, "
            f"got {layers!r}"
        )
    return tuple(layers)


@register(
    "resnet",
    f"ResNet-50/101-style, Bottleneck blocks in {STAGES} stages, {IMAGE}x{IMAGE} images",
    defaults={"layers": 1, "width": 8, "batch": 2},
    meaning={
        "layers": "bottleneck blocks per stage (int, or a tuple of 4; (3,4,6,3) is ResNet-50)",
        "width": "stem channels = first stage's bottleneck width (doubles per stage)",
        "batch": f"batch size (3x{IMAGE}x{IMAGE} images)",
    },
    stage_layers=True,
)
def build_resnet(
    layers: int | tuple[int, ...], width: int, batch: int
) -> tuple[nn.Module, torch.Tensor]:
    model = ResNet(stage_depths("resnet", layers), width)
    return model, torch.randn(batch, 3, IMAGE, IMAGE)
