"""Tests of hiremate.zoo.paper: the settings at the HiRemate paper's sizes.

The band check builds each graph and compares its forward size with the paper's Table 3(a)
figure (an external truth); the fast test builds the two smallest models, the slow one all.
"""

from __future__ import annotations

import pytest
import torch

import hiremate
from hiremate import zoo
from hiremate.errors import ConfigError

PAPER_NAMES = ["gpt-24", "gpt-96", "unet", "mlpmixer", "regnet32", "resnet101",
               "transformer-6-6", "transformer-36-36", "fno1d", "fno3d"]
SMALL = ["fno1d", "unet"]


def forward_ratio(name: str) -> float:
    model, sample = zoo.get_paper(name)
    graph = hiremate.build_graph(model, sample, cost_model="flops")
    return len(graph.fwd_nodes) / zoo.paper_model(name).paper_fwd_nodes


def test_table_is_well_formed():
    table = zoo.paper_models()
    assert list(table) == PAPER_NAMES
    for name, m in table.items():
        assert m.paper_name == name
        assert m.zoo_name in zoo.names()
        zoo.registry.resolve_args(m.zoo_name, layers=m.layers, width=m.width, batch=m.batch)
        assert m.paper_fwd_nodes > 0 and len(m.paper_partition) == 4
        assert all(isinstance(v, int) and v > 0 for v in m.paper_partition)
        assert m.note
    # The paper's figures, as printed in its Table 3(a) and 3(b).
    assert table["gpt-96"].paper_fwd_nodes == 1447
    assert table["transformer-36-36"].paper_partition == (16, 128, 67, 19)


def test_paper_models_is_a_copy():
    zoo.paper_models().clear()
    assert list(zoo.paper_models()) == PAPER_NAMES


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ConfigError, match="valid names are: gpt-24, gpt-96"):
        zoo.get_paper("gpt-48")
    with pytest.raises(ValueError):  # ConfigError is also a ValueError
        zoo.paper_model(["unet"])  # type: ignore[arg-type]


def test_get_paper_builds_the_setting():
    m = zoo.paper_model("fno1d")
    model, sample = zoo.get_paper("fno1d", dtype=torch.float64)
    ref_model, ref_sample = zoo.get(m.zoo_name, m.layers, m.width, m.batch, torch.float64)
    assert torch.equal(sample, ref_sample)
    assert sample.dtype == torch.float64 and sample.shape[0] == m.batch
    assert torch.equal(model(sample), ref_model(ref_sample))


@pytest.mark.parametrize("name", SMALL)
def test_small_models_in_band(name):
    assert 0.5 <= forward_ratio(name) <= 2


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_NAMES)
def test_every_model_in_band(name):
    assert 0.5 <= forward_ratio(name) <= 2
