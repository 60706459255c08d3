"""The decision table's factories (``hiremate.zoo.sized``): sized, deterministic, defaults kept."""

from __future__ import annotations

import pytest
import torch

from hiremate.errors import ConfigError
from hiremate.sweep.spec import import_factory
from hiremate.zoo import output_loss, sized, split_sample

TINY = {
    "gpt2": dict(layers=1, width=32, heads=2, seq=8, batch=1, vocab=64),
    "llama": dict(layers=1, width=32, heads=2, seq=8, batch=1, vocab=64),
    "vit": dict(layers=1, width=32, heads=2, image=16, patch=8, batch=1),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_factory_is_deterministic_and_leaves_the_rng(name):
    factory = import_factory(f"hiremate.zoo.sized:{name}")
    state = torch.get_rng_state()
    (m1, s1), (m2, s2) = factory(**TINY[name]), factory(**TINY[name])
    assert torch.equal(torch.get_rng_state(), state)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    for key in s1:
        assert torch.equal(s1[key], s2[key])
    args, kwargs = split_sample(s1)
    output_loss(m1(*args, **kwargs)).backward()


def test_hugging_face_defaults_are_kept():
    model, _ = sized.gpt2(**TINY["gpt2"])
    assert model.config.resid_pdrop == pytest.approx(0.1)  # dropout stays on, as users run it
    assert model.config.eos_token_id == 63  # inside the smaller vocabulary


@pytest.mark.parametrize("bad", [dict(layers=0), dict(seq=True), dict(width=2.5)])
def test_bad_sizes_raise(bad):
    with pytest.raises(ConfigError):
        sized.gpt2(**{**TINY["gpt2"], **bad})


def test_vit_patch_must_divide_the_image():
    with pytest.raises(ConfigError, match="multiple of the patch"):
        sized.vit(**{**TINY["vit"], "image": 20})
