"""``writes_undone``: the build's real runs of the user's forward put back what it wrote into
parameters and inputs, values and version counters, and copy only what is written."""

from __future__ import annotations

import torch

from hiremate.graphbuilder.untouched import _CopyOnWrite, writes_undone


def test_writes_through_views_and_data_are_put_back_and_only_written_tensors_copied() -> None:
    weight = torch.nn.Parameter(torch.randn(4, 3))
    batch, other = torch.randn(2, 3), torch.randn(5)
    kept = [t.detach().clone() for t in (weight, batch, other)]
    versions = [t._version for t in (weight, batch, other)]
    watch = _CopyOnWrite([weight, batch, other])
    with watch:
        with torch.no_grad():
            weight[1].mul_(3)  # through a view
            torch.embedding_renorm_(weight, torch.tensor([0, 2]), 0.1, 2.0)
        batch.div_(255)
        assert (other * 2).shape == (5,)  # read, not written
    assert sorted(len(v[1]) for v in watch.saved.values()) == [2, 4]  # the two written
    watch.restore()
    for t, k, v in zip((weight, batch, other), kept, versions):
        assert torch.equal(t, k) and t._version == v
    with writes_undone([batch]):
        batch.add_(1)
    assert torch.equal(batch, kept[1]) and batch._version == versions[1]


def test_with_nothing_to_watch_the_body_runs_without_the_mode() -> None:
    """A higher-order op has no rule for the watch's dispatch mode: the capture's probe runs
    again without the watch when the watched run raises, and an empty watch installs none."""
    x = torch.randn(3)
    with writes_undone([]):
        out = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
    assert out.shape == (3,)
