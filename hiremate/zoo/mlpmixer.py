"""``mlpmixer``: MLP-Mixer (Tolstikhin et al., 2021), a vision model made only of MLPs.

Each block mixes across patches (an MLP on the transposed token matrix) and then across
channels, each with a pre-LayerNorm and a residual: a chain of identical blocks whose
activations are large relative to their compute, a plain case for rematerialisation.
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register

IMAGE = 32
PATCH = 4
NUM_CLASSES = 10


class MixerMlp(nn.Module):
    """Linear, GELU, Linear."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MixerBlock(nn.Module):
    """Token mixing then channel mixing, each as ``x + mlp(norm(x))``."""

    def __init__(self, tokens: int, channels: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.token_mlp = MixerMlp(tokens, 2 * tokens)
        self.norm2 = nn.LayerNorm(channels)
        self.channel_mlp = MixerMlp(channels, 4 * channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, tokens, channels)
        y = self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + y
        return x + self.channel_mlp(self.norm2(x))


class MlpMixer(nn.Module):
    """Patch embedding, ``depth`` mixer blocks, LayerNorm, mean over tokens, linear head."""

    def __init__(self, depth: int, channels: int, image: int = IMAGE, patch: int = PATCH,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = nn.Conv2d(3, channels, kernel_size=patch, stride=patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, channels) for _ in range(depth)))
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


@register(
    "mlpmixer",
    f"MLP-Mixer, {IMAGE}x{IMAGE} images, {PATCH}x{PATCH} patches ({(IMAGE // PATCH) ** 2} tokens)",
    defaults={"layers": 2, "width": 32, "batch": 2},
    meaning={
        "layers": "number of mixer blocks",
        "width": "channels per token (hidden size)",
        "batch": f"batch size (3x{IMAGE}x{IMAGE} images)",
    },
)
def build_mlpmixer(layers: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    return MlpMixer(layers, width), torch.randn(batch, 3, IMAGE, IMAGE)
