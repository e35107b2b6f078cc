import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch  # noqa: E402

from icml26.plotting import (  # noqa: E402
    PALETTE,
    draw_dag,
    method_colors,
    subplots_grid,
    use_book_style,
)


def test_book_style_is_applied():
    use_book_style()
    assert mpl.rcParams["axes.spines.top"] is False
    assert mpl.rcParams["axes.prop_cycle"].by_key()["color"][: len(PALETTE)] == list(PALETTE)


def test_method_colors_are_fixed_and_distinct():
    colors = method_colors(["MMD", "MOD"])
    assert colors == {"MMD": PALETTE[0], "MOD": PALETTE[1]}
    with pytest.raises(ValueError, match="distinct"):
        method_colors(["MMD", "MMD"])
    with pytest.raises(ValueError, match="at most"):
        method_colors([str(i) for i in range(len(PALETTE) + 1)])


def test_subplots_grid_hides_unused_panels():
    fig, axes = subplots_grid(4, columns=3)
    assert len(axes) == 4 and len(fig.axes) == 6
    assert sum(ax.get_visible() for ax in fig.axes) == 4


def test_explore_runs_the_defaults_when_the_book_executes(monkeypatch):
    from icml26.plotting import explore

    calls = []

    def view(width=2.0, kind="a"):
        calls.append((width, kind))
        return width

    monkeypatch.setenv("ICML26_OFFLINE", "1")
    assert explore(view, width=(1.0, 4.0, 0.5), kind=["a", "b"]) is None
    assert calls == [(2.0, "a")]
    with pytest.raises(ValueError, match="default"):
        explore(lambda width: width, width=(1.0, 4.0))


def test_explore_builds_live_controls_in_jupyter(monkeypatch):
    import ipywidgets

    from icml26.plotting import explore

    made = []
    monkeypatch.setattr(ipywidgets, "interact", lambda f, **kw: made.append((f(), kw)))
    monkeypatch.delenv("ICML26_OFFLINE", raising=False)
    assert explore(lambda width=2.0: width, width=(1.0, 4.0, 0.5)) is None
    assert made == [(2.0, {"width": (1.0, 4.0, 0.5)})]


CONFOUNDED = {"nodes": {"W": (1, 1), "A": (0, 0), "Y": (2, 0)},
              "edges": [("W", "A"), ("W", "Y"), ("A", "Y")]}


def test_draw_dag_draws_every_node_and_edge_and_marks_cuts():
    fig, ax = plt.subplots()
    draw_dag(ax, CONFOUNDED, cut=[("W", "A")], highlight=["A"])
    circles = [p for p in ax.patches if isinstance(p, Circle)]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(circles) == 3 and len(arrows) == 3
    assert sum(mpl.colors.to_hex(c.get_facecolor()) == PALETTE[0].lower() for c in circles) == 1
    assert [a.get_linestyle() for a in arrows].count("--") == 1
    plt.close(fig)


def test_draw_dag_rejects_unknown_nodes_and_cuts():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="unknown"):
        draw_dag(ax, CONFOUNDED, highlight=["Q"])
    with pytest.raises(ValueError, match="unknown"):
        draw_dag(ax, {"nodes": {"A": (0, 0)}, "edges": [("A", "B")]})
    with pytest.raises(ValueError, match="cut edges"):
        draw_dag(ax, CONFOUNDED, cut=[("Y", "A")])
    plt.close(fig)
