"""Drawing a hierarchy with matplotlib (for ``hiremate inspect NAME --partition``).

The forward graph is laid out by longest-path depth (x) in execution order (y within a column);
each node is coloured by its top-level part, and bottom-level subgraphs are outlined by the
convex hull of their nodes... approximated by a rectangle, which is enough to see the grouping.
Graphs too large to read node by node are drawn as their top-level graph instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .hierarchy import Hierarchy

log = logging.getLogger(__name__)

MAX_DRAWN_NODES = 1500


def _layout(preds: list[tuple[int, ...]]) -> list[tuple[float, float]]:
    depth = [0] * len(preds)
    for i, ps in enumerate(preds):
        depth[i] = 1 + max((depth[p] for p in ps), default=-1)
    row: dict[int, int] = {}
    pos = []
    for i in range(len(preds)):
        r = row.get(depth[i], 0)
        row[depth[i]] = r + 1
        pos.append((float(depth[i]), -float(r)))
    return pos


def draw_hierarchy(hierarchy: Hierarchy, path: str | Path, title: str | None = None) -> Path:
    """Write a PNG picture of ``hierarchy`` to ``path`` and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    path = Path(path)
    summary = hierarchy.summary()
    level = 0 if summary["forward_nodes"] <= MAX_DRAWN_NODES else hierarchy.depth - 1
    if level:
        log.info("graph of %d nodes: drawing its top-level graph only", summary["forward_nodes"])
    parts = hierarchy.levels[level]
    index = {p: k for k, p in enumerate(parts)}
    if level == 0:
        preds = list(hierarchy.dag.preds)
    else:
        g = hierarchy.level_graph(level)
        preds = [tuple(sorted(index[_part(hierarchy, q)] for q in g.predecessors(str(p))))
                 for p in parts]
    pos = _layout(preds)
    top_owner = hierarchy.owner(hierarchy.depth - 1)
    bottom_owner = hierarchy.owner(1) if hierarchy.depth > 1 else {}
    colours = {}
    for k, p in enumerate(hierarchy.top):
        colours[p] = plt.cm.tab20(k % 20)
    width = max(6.0, min(40.0, 0.4 * (max((x for x, _ in pos), default=0) + 2)))
    height = max(4.0, min(40.0, 0.4 * (max((-y for _, y in pos), default=0) + 2)))
    fig, ax = plt.subplots(figsize=(width, height))
    for i, ps in enumerate(preds):
        for p in ps:
            ax.plot([pos[p][0], pos[i][0]], [pos[p][1], pos[i][1]], color="0.75", lw=0.6,
                    zorder=1)
    leaf_of = [hierarchy.leaves(p)[0] for p in parts]
    ax.scatter([x for x, _ in pos], [y for _, y in pos], s=30, zorder=2,
               c=[colours.get(top_owner[leaf], "grey") for leaf in leaf_of])
    if level == 0 and bottom_owner:
        boxes: dict = {}
        for k, leaf in enumerate(leaf_of):
            owner = bottom_owner[leaf]
            if not owner.is_node:
                boxes.setdefault(owner, []).append(pos[k])
        for pts in boxes.values():
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            ax.add_patch(Rectangle((min(xs) - 0.3, min(ys) - 0.3), max(xs) - min(xs) + 0.6,
                                   max(ys) - min(ys) + 0.6, fill=False, lw=0.8, ec="0.3"))
    ax.set_axis_off()
    ax.set_title(title or (
        f"{summary['partitioner']}: {summary['forward_nodes']} nodes, {summary['levels']} levels,"
        f" {summary['subgraphs']} subgraphs ({summary['unique_subgraphs']} unique),"
        f" largest {summary['largest_subgraph']}"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _part(hierarchy: Hierarchy, name: str):
    from .hierarchy import Part

    return Part("node" if name[0] == "n" else "subgraph", int(name[1:]))
