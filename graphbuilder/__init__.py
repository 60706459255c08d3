"""Graph builder: capture a model as a CD-graph with measured costs."""

from hiremate.graphbuilder.build import build_graph
from hiremate.graphbuilder.capture import capture, normalise_sample

__all__ = ["build_graph", "capture", "normalise_sample"]
