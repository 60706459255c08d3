"""Sums of partial gradients are backward nodes of their own, not part of the backward of the
forward node autograd tagged them with (:class:`hiremate.graphbuilder.grouping.GradientOrigins`).

Autograd tags the sums it inserts where a value has several readers with the sequence number
of the first backward op it ran (a model's head). Paired with the head, a ResNet's residual
sums sat in the head's backward although they read gradients of the layers below; on a packed
RNN's graph the blocks' backward parts then depended on each other in a cycle, and the
hierarchical H-ILP refused every such subgraph."""

from __future__ import annotations

import logging

import torch
from torch import nn

import hiremate
from hiremate.api import solve_graph
from hiremate.ir.graph import Graph
from test_capture_packed import Tagger, sample


def reads_against_pairing(graph: Graph) -> list[tuple[str, str]]:
    """``(backward node, producer)`` pairs where a backward node paired with forward node ``F``
    reads a gradient made by the backward of a forward node that is not downstream of ``F``."""
    below: dict[int, set[int]] = {}
    for node in reversed(graph.fwd_nodes):
        reach = {node.id}
        for d in node.outputs:
            for user in graph.users(d):
                if graph.nodes[user].is_fwd:
                    reach |= below[user]
        below[node.id] = reach
    found = []
    for node in graph.bwd_nodes:
        if node.partner is None:
            continue
        for d in node.inputs:
            p = graph.data[d].producer
            if p is None or not graph.nodes[p].is_bwd:
                continue
            origin = graph.nodes[p].partner
            if origin is not None and origin not in below[node.partner]:
                found.append((node.name, graph.nodes[p].name))
    return found


class Residual(nn.Module):
    """Three residual blocks and a head: each block's input has two readers."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                    for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_residual_sums_are_unpaired_nodes():
    torch.manual_seed(0)
    graph = hiremate.build_graph(Residual(), torch.randn(8, 16), cost_model="flops")
    assert reads_against_pairing(graph) == []
    sums = [n for n in graph.bwd_nodes if n.partner is None
            and sum(graph.data[d].producer is not None
                    and graph.nodes[graph.data[d].producer].is_bwd for d in n.inputs) >= 2]
    assert len(sums) >= 2, [n.name for n in graph.bwd_nodes]


def test_zoo_resnet_pairs_no_sum_with_its_head():
    model, sample_ = hiremate.zoo.get("resnet")
    graph = hiremate.build_graph(model, sample_, cost_model="flops")
    assert reads_against_pairing(graph) == []


def test_packed_rnn_hierarchy_has_no_backward_cycle(caplog):
    torch.manual_seed(0)
    model = Tagger(rnn="rnn", nonlinearity="relu").double()
    graph = hiremate.build_graph(model, sample([4, 10, 7]), cost_model="flops")
    assert reads_against_pairing(graph) == []
    with caplog.at_level(logging.INFO, logger="hiremate"):
        result = solve_graph(graph, 0.9, n_jobs=1, cache=False, progress=False,
                             flat=["twremat"], polish=[])
    cycles = [r.getMessage() for r in caplog.records if "in a cycle" in r.getMessage()]
    assert cycles == []
    assert hiremate.simulate(graph, result.schedule).valid
