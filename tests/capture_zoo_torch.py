"""The capture table's models written here in plain PyTorch: blocks that rebuild what the timm
models do that matters to capture, and recurrent, in-place and checkpointed models (builders
for ``capture_zoo.CASES``; sizes and losses from ``capture_sizes``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from capture_sizes import (
    BATCH, HEADS, IMAGE, LAYERS, PATCH, SEQ, WIDTH, Built, _pixels, tensor_sum,
)


# -- blocks equivalent to the timm models, written here ---------------------------------------

class BasicBlock(nn.Module):
    """timm/torchvision ResNet basic block: ``x += shortcut`` then ``ReLU(inplace=True)``."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.act2 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x))
        x += shortcut
        return self.act2(x)


class ResNetBlocks(nn.Module):
    def __init__(self, c: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(BasicBlock(c), BasicBlock(c))
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(x.mean((2, 3)))


class ConvNeXtBlock(nn.Module):
    """timm ConvNeXt block: depthwise 7x7 conv, LayerNorm channels-last, MLP, layer scale,
    residual."""

    def __init__(self, c: int):
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1 = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.fc2(self.act(self.fc1(self.norm(x))))
        x = x.mul(self.gamma).permute(0, 3, 1, 2)
        return x + shortcut


class ConvNeXtBlocks(nn.Module):
    def __init__(self, c: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, stride=4)
        self.stem_norm = nn.LayerNorm(c, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(c), ConvNeXtBlock(c))
        self.head_norm = nn.LayerNorm(c, eps=1e-6)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.blocks(x)
        return self.fc(self.head_norm(x.mean((2, 3))))


class VitBlock(nn.Module):
    """timm ViT block: pre-norm attention through ``F.scaled_dot_product_attention`` (timm's
    fused attention), pre-norm GELU MLP, two residuals."""

    def __init__(self, c: int, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.norm2 = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VitBlocks(nn.Module):
    def __init__(self, c: int = WIDTH, classes: int = 10):
        super().__init__()
        tokens = (IMAGE // PATCH) ** 2
        self.patch = nn.Conv2d(3, c, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.randn(1, 1, c) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, c) * 0.02)
        self.blocks = nn.Sequential(VitBlock(c), VitBlock(c))
        self.norm = nn.LayerNorm(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def resnet_block() -> Built:
    return ResNetBlocks(), _pixels(), tensor_sum


def convnext_block() -> Built:
    return ConvNeXtBlocks(), _pixels(), tensor_sum


def vit_block() -> Built:
    return VitBlocks(), _pixels(), tensor_sum


# -- recurrent, in-place, checkpointed ------------------------------------------------------

class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.Module]):
        super().__init__()
        self.rnn = cell(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out)


# recurrent layers unroll over time: 3 steps of 2 layers make a graph of some 150 nodes (6
# steps made 305, solved in 35-41 s of the default run; 16 steps made 785, two and a half
# minutes), and the unrolling is the same at any length
RNN_STEPS = 3


def lstm() -> Built:
    return Recurrent(nn.LSTM), torch.randn(BATCH, RNN_STEPS, WIDTH, dtype=torch.float64), \
        tensor_sum


def gru() -> Built:
    return Recurrent(nn.GRU), torch.randn(BATCH, RNN_STEPS, WIDTH, dtype=torch.float64), \
        tensor_sum


class PackedRecurrent(nn.Module):
    """An LSTM over a padded batch of sequences of different lengths, packed as sequence models
    are written (``enforce_sorted=False``), unpacked for a label per step."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(WIDTH, WIDTH, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                  total_length=x.shape[1])
        return self.head(out)


def lstm_packed() -> Built:
    x = torch.randn(BATCH + 1, RNN_STEPS + 1, WIDTH, dtype=torch.float64)
    return PackedRecurrent(), (x, torch.tensor([RNN_STEPS - 1, RNN_STEPS + 1, RNN_STEPS])), \
        tensor_sum


def mlp_bn_inplace() -> Built:
    model = nn.Sequential(
        nn.Linear(WIDTH, 2 * WIDTH), nn.BatchNorm1d(2 * WIDTH), nn.ReLU(inplace=True),
        nn.Linear(2 * WIDTH, 2 * WIDTH), nn.BatchNorm1d(2 * WIDTH), nn.ReLU(inplace=True),
        nn.Linear(2 * WIDTH, 10))
    return model, torch.randn(8, WIDTH, dtype=torch.float64), tensor_sum


class ConvBnInplace(nn.Module):
    """Three convs with BatchNorm and ``ReLU(inplace=True)`` and a ``y += h`` residual (found
    infeasible below 92% of the autodiff peak at 34340ab)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv3, self.bn3 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(h)))
        y = self.bn3(self.conv3(y))
        y += h
        y = self.relu(y)
        return self.fc(y.mean((2, 3)))


def conv_bn_inplace() -> Built:
    return ConvBnInplace(), _pixels(), tensor_sum


class Checkpointed(nn.Module):
    """Linear, then a segment under ``torch.utils.checkpoint.checkpoint`` (its input requires
    grad, since it follows the Linear), then a head."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(WIDTH, 2 * WIDTH)
        self.segment = nn.Sequential(nn.Linear(2 * WIDTH, 2 * WIDTH), nn.GELU(),
                                     nn.Linear(2 * WIDTH, 2 * WIDTH), nn.Tanh())
        self.head = nn.Linear(2 * WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = torch.utils.checkpoint.checkpoint(self.segment, h, use_reentrant=self.use_reentrant)
        return self.head(h)


def checkpoint_nonreentrant() -> Built:
    return Checkpointed(False), torch.randn(BATCH, SEQ, WIDTH, dtype=torch.float64), tensor_sum


def checkpoint_reentrant() -> Built:
    return Checkpointed(True), torch.randn(BATCH, SEQ, WIDTH, dtype=torch.float64), tensor_sum
