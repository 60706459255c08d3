"""``fno1d`` and ``fno3d``: Fourier Neural Operators (Li et al., 2021), written in plain torch.nn.

A Fourier layer transforms its input with a real FFT, multiplies the lowest ``modes``
frequencies by learned complex weights (a per-frequency channel-mixing matrix), drops the
others, transforms back, and adds a pointwise (1x1) linear path; GELU follows every layer but
the last. Lifting and projection MLPs map to and from the hidden channels.

The complex weights are stored as two real parameters (real and imaginary parts) combined with
``torch.complex`` in the forward: real parameters are what optimisers, gradient checks and
capture paths expect. The truncated spectrum is zero-filled without in-place writes
(``irfft``'s ``n`` argument pads the last dimension; ``torch.cat`` with zeros the others) so
the captured graph is functional.
"""

from __future__ import annotations

import torch
from torch import nn

from hiremate.zoo.registry import register

GRID_1D = 64
MODES_1D = 8
GRID_3D = (8, 8, 8)
MODES_3D = (3, 3, 3)


def _complex_weight(*shape: int, scale: float) -> tuple[nn.Parameter, nn.Parameter]:
    """Real and imaginary parts, uniform in ``[0, scale)`` as in the FNO reference setup."""
    return (nn.Parameter(scale * torch.rand(*shape)), nn.Parameter(scale * torch.rand(*shape)))


class SpectralConv1d(nn.Module):
    """``irfft(W * rfft(x)[:modes])`` over the last dimension; W is (cin, cout, modes)."""

    def __init__(self, cin: int, cout: int, modes: int):
        super().__init__()
        self.modes = modes
        self.weight_re, self.weight_im = _complex_weight(cin, cout, modes, scale=1 / (cin * cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, cin, n)
        n = x.shape[-1]
        spectrum = torch.fft.rfft(x)[..., : self.modes]
        weight = torch.complex(self.weight_re, self.weight_im)
        mixed = torch.einsum("bix,iox->box", spectrum, weight)
        return torch.fft.irfft(mixed, n=n)


class SpectralConv3d(nn.Module):
    """The 3-D version: the kept frequencies are the four corners of low |kx|, |ky| (both
    signs) with the lowest ``kt`` (the real FFT's last dimension has no negative half)."""

    def __init__(self, cin: int, cout: int, modes: tuple[int, int, int]):
        super().__init__()
        self.modes = modes
        scale = 1 / (cin * cout)
        parts = [_complex_weight(cin, cout, *modes, scale=scale) for _ in range(4)]
        self.weight_re = nn.ParameterList([re for re, _ in parts])
        self.weight_im = nn.ParameterList([im for _, im in parts])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, cin, X, Y, T)
        m1, m2, m3 = self.modes
        size_x, size_y, size_t = x.shape[-3:]
        spec = torch.fft.rfftn(x, dim=(-3, -2, -1))
        corners = [
            spec[:, :, :m1, :m2, :m3],
            spec[:, :, :m1, -m2:, :m3],
            spec[:, :, -m1:, :m2, :m3],
            spec[:, :, -m1:, -m2:, :m3],
        ]
        out = [
            torch.einsum("bixyz,ioxyz->boxyz", c, torch.complex(re, im))
            for c, re, im in zip(corners, self.weight_re, self.weight_im)
        ]
        batch, cout = out[0].shape[:2]
        kw = {"dtype": out[0].dtype, "device": out[0].device}
        gap_y = torch.zeros(batch, cout, m1, size_y - 2 * m2, m3, **kw)
        low_x = torch.cat([out[0], gap_y, out[1]], dim=3)
        high_x = torch.cat([out[2], gap_y, out[3]], dim=3)
        gap_x = torch.zeros(batch, cout, size_x - 2 * m1, size_y, m3, **kw)
        full = torch.cat([low_x, gap_x, high_x], dim=2)
        return torch.fft.irfftn(full, s=(size_x, size_y, size_t), dim=(-3, -2, -1))


class FNO(nn.Module):
    """Lift (Linear), ``depth`` Fourier layers, project (Linear, GELU, Linear).

    Input and output are channel-last, ``(batch, *grid, channels)``, as in the FNO papers; the
    Fourier layers work channel-first.
    """

    def __init__(self, dims: int, depth: int, width: int, modes: int | tuple[int, int, int],
                 in_channels: int, out_channels: int = 1):
        super().__init__()
        self.dims = dims
        self.lift = nn.Linear(in_channels, width)
        conv = nn.Conv1d if dims == 1 else nn.Conv3d
        self.spectral = nn.ModuleList(
            SpectralConv1d(width, width, modes) if dims == 1  # type: ignore[arg-type]
            else SpectralConv3d(width, width, modes)  # type: ignore[arg-type]
            for _ in range(depth)
        )
        self.pointwise = nn.ModuleList(conv(width, width, 1) for _ in range(depth))
        self.act = nn.GELU()
        self.project = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, out_channels)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x).movedim(-1, 1)
        last = len(self.spectral) - 1
        for i, (spectral, pointwise) in enumerate(zip(self.spectral, self.pointwise)):
            x = spectral(x) + pointwise(x)
            if i < last:
                x = self.act(x)
        return self.project(x.movedim(1, -1))


@register(
    "fno1d",
    f"1-D Fourier Neural Operator on a grid of {GRID_1D} points, {MODES_1D} modes",
    defaults={"layers": 4, "width": 16, "batch": 4},
    meaning={
        "layers": "number of Fourier layers",
        "width": "hidden channels",
        "batch": f"batch size (inputs of shape ({GRID_1D}, 2): a function and the grid)",
    },
)
def build_fno1d(layers: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    model = FNO(1, layers, width, MODES_1D, in_channels=2)
    grid = torch.linspace(0, 1, GRID_1D).expand(batch, GRID_1D)
    sample = torch.stack([torch.randn(batch, GRID_1D), grid], dim=-1)
    return model, sample


@register(
    "fno3d",
    f"3-D Fourier Neural Operator on a {'x'.join(map(str, GRID_3D))} grid, "
    f"{'x'.join(map(str, MODES_3D))} modes",
    defaults={"layers": 3, "width": 8, "batch": 2},
    meaning={
        "layers": "number of Fourier layers",
        "width": "hidden channels",
        "batch": "batch size (inputs of shape (8, 8, 8, 4): a function and 3 grid coordinates)",
    },
)
def build_fno3d(layers: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor]:
    model = FNO(3, layers, width, MODES_3D, in_channels=4)
    axes = torch.meshgrid(*(torch.linspace(0, 1, n) for n in GRID_3D), indexing="ij")
    grid = torch.stack(axes, dim=-1).expand(batch, *GRID_3D, 3)
    sample = torch.cat([torch.randn(batch, *GRID_3D, 1), grid], dim=-1)
    return model, sample
