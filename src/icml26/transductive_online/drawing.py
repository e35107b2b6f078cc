"""Draw level-constrained trees and LCLL trees (trees of level-constrained trees)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from icml26.plotting import PALETTE

from .trees import LCLLNode, LCNode


def _layout(root, point_name: Callable[[int], str], leaf_name: Callable[[int], str]):
    """Positions of nodes and edges: leaves on consecutive x, parents centred over children.

    Every LCLL node starts a new colour group, so the blocks of the tree of trees stand out.
    """
    nodes, edges, counter = [], [], {"leaf": 0, "group": -1}

    def walk(node, depth: int, group: int) -> tuple[float, int]:
        if isinstance(node, LCLLNode):
            counter["group"] += 1
            return walk(node.tree, depth, counter["group"])
        if isinstance(node, LCNode):
            placed = [(label, *walk(child, depth + 1, group)) for label, child in node.branches]
            x = sum(px for _, px, _ in placed) / len(placed)
            index = len(nodes)
            nodes.append({"x": x, "y": -depth, "text": point_name(node.point), "group": group})
            edges.extend((index, child_index, label) for label, _, child_index in placed)
            return x, index
        x = float(counter["leaf"])
        counter["leaf"] += 1
        nodes.append({"x": x, "y": -depth, "text": leaf_name(int(node)), "group": None})
        return x, len(nodes) - 1

    walk(root, 0, counter["group"] + 1 if isinstance(root, LCNode) else 0)
    return nodes, edges


def _draw_edges(ax, nodes: list[dict], edges) -> None:
    """Grey edges between laid-out nodes, each labelled at its midpoint."""
    for parent, child, label in edges:
        a, b = nodes[parent], nodes[child]
        ax.plot([a["x"], b["x"]], [a["y"], b["y"]], color="0.6", linewidth=1, zorder=1)
        ax.text((a["x"] + b["x"]) / 2, (a["y"] + b["y"]) / 2, str(label), fontsize=8,
                ha="center", va="center", bbox={"boxstyle": "round,pad=0.1", "fc": "white",
                                                "ec": "none"}, zorder=3)


def draw_tree(ax, root, point_name: Callable[[int], str] = str,
              leaf_name: Callable[[int], str] = lambda h: f"h{h}") -> None:
    """Draw a level-constrained tree (:class:`LCNode`) or an LCLL tree (:class:`LCLLNode`).

    Internal nodes show their point, edges their label and leaves a hypothesis consistent with the
    path; in an LCLL tree each node's level-constrained tree gets its own colour.
    """
    nodes, edges = _layout(root, point_name, leaf_name)
    _draw_edges(ax, nodes, edges)
    for node in nodes:
        leaf = node["group"] is None
        color = "white" if leaf else PALETTE[node["group"] % len(PALETTE)]
        ax.text(node["x"], node["y"], node["text"], fontsize=8 if leaf else 9, ha="center",
                va="top" if leaf else "center", color="black" if leaf else "white",
                rotation=90 if leaf else 0, zorder=4,
                bbox={"boxstyle": "round,pad=0.25", "fc": color, "ec": "0.4" if leaf else color})
    ax.set_xlim(-0.7, max(n["x"] for n in nodes) + 0.7)
    ax.set_ylim(min(n["y"] for n in nodes) - 1.2, 0.5)
    ax.axis("off")


def draw_game_tree(ax, cls, solver=None, point_name: Callable[[int], str] = str,
                   leaf_name: Callable[[int], str] = lambda h: f"h{h}") -> None:
    """Draw the game tree of a small class on its known sequence, with the values of
    Eq. (eq-minimax).

    Every internal node is a round in which the version space disagrees (forced rounds are
    skipped: they cost nothing); it shows the round's point and the deterministic value
    :math:`M(V, t)` of the game from there, and its edges carry the labels still possible. Leaves
    show the single hypothesis left. Only for classes of a few dozen hypotheses.
    """
    from .minimax import MinimaxSolver

    solver = solver or MinimaxSolver()
    matrix = cls.matrix if hasattr(cls, "matrix") else np.asarray(cls)
    if matrix.shape[0] > 64:
        raise ValueError("draw_game_tree is for small classes (at most 64 hypotheses)")
    nodes, edges, leaves = [], [], [0]

    def walk(rows: np.ndarray, t: int, depth: int) -> tuple[float, int]:
        while t < matrix.shape[1] and len(np.unique(matrix[rows, t])) == 1:
            t += 1
        if t == matrix.shape[1]:
            x = float(leaves[0])
            leaves[0] += 1
            nodes.append({"x": x, "y": -depth, "text": leaf_name(int(rows[0])), "leaf": True})
            return x, len(nodes) - 1
        placed = [(int(y), *walk(rows[matrix[rows, t] == y], t + 1, depth + 1))
                  for y in np.unique(matrix[rows, t])]
        x = sum(px for _, px, _ in placed) / len(placed)
        value = solver.deterministic(matrix[rows, t:])
        nodes.append({"x": x, "y": -depth, "text": f"{point_name(t)}\nM={value}", "leaf": False})
        edges.extend((len(nodes) - 1, index, label) for label, _, index in placed)
        return x, len(nodes) - 1

    walk(np.unique(matrix, axis=0, return_index=True)[1], 0, 0)
    _draw_edges(ax, nodes, edges)
    for node in nodes:
        ax.text(node["x"], node["y"], node["text"], fontsize=8, ha="center",
                va="top" if node["leaf"] else "center",
                color="black" if node["leaf"] else "white", zorder=4,
                bbox={"boxstyle": "round,pad=0.25", "fc": "white" if node["leaf"] else PALETTE[0],
                      "ec": "0.4" if node["leaf"] else PALETTE[0]})
    ax.set_xlim(-0.7, max(n["x"] for n in nodes) + 0.7)
    ax.set_ylim(min(n["y"] for n in nodes) - 1.0, 0.6)
    ax.axis("off")
