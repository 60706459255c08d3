"""``unet``: a UNet (Ronneberger et al., 2015) written in plain torch.nn.

An encoder of ``levels`` double-convolution stages with max-pooling between them, a bottom
stage, and a decoder that upsamples (transposed convolution), concatenates the encoder's
activation of the same resolution, merges the concatenation with a 1x1 convolution and
convolves again. The skip connections keep early activations alive until late in the backward:
the long-range dependencies that make UNet a hard case for chain-only rematerialisation.

Why the 1x1 merge (a common decoder variant, e.g. in UNet 3+ and feature-pyramid decoders)
rather than the original 3x3 convolution straight on the concatenation: on CPU, and in float64
(gradient checks) everywhere, PyTorch's 3x3 convolution materialises an im2col buffer of
``9 x in_channels x H x W`` values. In the original layout the top decoder convolution reads
``2 x width`` channels at full resolution, so that buffer, with the convolution's input and
output, is most of the autodiff peak *at any size*: width, batch, image size and depth scale
both sides alike (the measured floors are in docs/results-history.md, notes on "unet"). No schedule
can then go below that, which makes the model a test of one convolution's scratch buffer
rather than of the network's activations. With the merge, every 3x3 convolution reads at most
``width`` channels at full resolution, so the largest single-node need is well below half the
autodiff peak and budgets from 50% down test scheduling (``tests/test_zoo.py`` checks the
floor).
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register

IN_CHANNELS = 3
OUT_CHANNELS = 2
MIN_IMAGE = 32
GROUPS = 4


class DoubleConv(nn.Module):
    """(3x3 conv, GroupNorm, ReLU) twice."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.GroupNorm(min(GROUPS, cout), cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.GroupNorm(min(GROUPS, cout), cout),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class UNet(nn.Module):
    """``levels`` down steps and as many up steps; channels double at each level down."""

    def __init__(self, levels: int, width: int, cin: int = IN_CHANNELS, cout: int = OUT_CHANNELS):
        super().__init__()
        chans = [width * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList()
        prev = cin
        for c in chans[:-1]:
            self.down.append(DoubleConv(prev, c))
            prev = c
        self.pool = nn.MaxPool2d(2)
        self.bottom = DoubleConv(chans[-2], chans[-1])
        self.up = nn.ModuleList()
        self.up_conv = nn.ModuleList()
        for c_low, c_high in zip(reversed(chans[1:]), reversed(chans[:-1])):
            self.up.append(nn.ConvTranspose2d(c_low, c_high, kernel_size=2, stride=2))
            self.up_conv.append(nn.Sequential(
                nn.Conv2d(2 * c_high, c_high, 1, bias=False),  # merge: no im2col buffer
                DoubleConv(c_high, c_high)))
        self.head = nn.Conv2d(chans[0], cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottom(x)
        for up, conv, skip in zip(self.up, self.up_conv, reversed(skips)):
            x = conv(torch.cat([skip, up(x)], dim=1))
        return self.head(x)


def image_size(levels: int) -> int:
    """The smallest side >= 32 that ``levels`` halvings leave at 2 pixels or more."""
    return max(MIN_IMAGE, 2 ** (levels + 1))


@register(
    "unet",
    "UNet: double 3x3 convs with GroupNorm, max-pool down, transposed-conv up, skip concats "
    "merged by 1x1 convs",
    defaults={"layers": 2, "width": 8, "batch": 2},
    meaning={
        "layers": "number of levels (down-sampling steps, and as many up-sampling steps)",
        "width": "channels of the first level (doubles per level)",
        "batch": f"batch size (3xSxS images, S = max({MIN_IMAGE}, 2**(layers+1)))",
    },
)
def build_unet(layers: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    side = image_size(layers)
    return UNet(layers, width), torch.randn(batch, IN_CHANNELS, side, side)
