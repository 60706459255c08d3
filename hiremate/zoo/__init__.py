"""hiremate.zoo: small, deterministic models to capture, schedule and test on.

TODO README
"""

from __future__ import annotations

from hiremate.zoo import fno, hf, mlp, mlpmixer, regnet, resnet, transformer, unet  # noqa: F401
from hiremate.zoo.registry import (
    ModelSpec,
    describe,
    get,
    names,
    output_loss,
    spec,
    split_sample,
)

__all__ = ["ModelSpec", "describe", "get", "names", "output_loss", "spec", "split_sample"]
