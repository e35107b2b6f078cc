"""The "What reproduced" ledger: every check of every executed chapter, with its verdict.

The build reads the rows that :mod:`icml26.claims` stores in the output metadata of each executed
notebook, writes them to ``_build/claims.json`` (what ``icml26 claims`` prints) and renders the
appendix page: a summary table (per chapter, how many paper claims and findings were reproduced,
contradicted or inconclusive, how many are underpowered, fragile or unexpected), then per chapter
a forest plot of the intervals and a table of every claim with its numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import nbformat

from icml26.claims import KINDS, VERDICTS, collect_rows

LEDGER_TABLE = "book/appendix/_reproduced_table.md"  # written by the build, included by the page
FOREST_DIR = "book/appendix/_ledger"  # forest plots, one PNG per chapter, written by the build
SUMMARY_COLUMNS = (*VERDICTS, "underpowered", "fragile", "unexpected")
VERDICT_COLORS = {"reproduced": "#009E73", "contradicted": "#D55E00", "inconclusive": "#7F7F7F"}


def chapter_rows(notebook_path: Path) -> list[dict]:
    """The check rows an executed notebook displays."""
    return collect_rows(nbformat.read(notebook_path, as_version=4))


def count_kinds(rows: list[dict]) -> dict[str, int]:
    """How many rows of each kind (every kind present, zero when absent)."""
    counts = dict.fromkeys(KINDS, 0)
    for row in rows:
        counts[row["kind"]] += 1
    return counts


def claim_rows(rows: list[dict]) -> list[dict]:
    """The paper claims and findings (the rows with one of the three verdicts)."""
    return [row for row in rows if row["kind"] != "verification"]


def count_verdicts(rows: list[dict]) -> dict[str, int]:
    """Per :data:`SUMMARY_COLUMNS`, how many paper claims and findings have it."""
    counts = dict.fromkeys(SUMMARY_COLUMNS, 0)
    for row in claim_rows(rows):
        counts[row["verdict"]] += 1
        for flag in ("underpowered", "fragile", "unexpected"):
            counts[flag] += bool(row.get(flag))
    return counts


def unexpected_rows(ledger: Mapping[str, dict]) -> list[tuple[str, dict]]:
    """``(slug, row)`` for every enforced claim whose verdict is not the expected one."""
    return [(slug, row) for slug, entry in ledger.items() for row in claim_rows(entry["rows"])
            if row.get("unexpected") and row.get("enforced", True)]


def ledger_file(out_root: Path) -> Path:
    return out_root / "_build" / "claims.json"


def save_ledger(ledger: Mapping[str, dict], out_root: Path) -> None:
    """Store ``{slug: {"title", "tier", "seed", "rows", "error"}}`` for ``icml26 claims``."""
    path = ledger_file(out_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ledger, indent=1))


def load_ledger(out_root: Path) -> dict[str, dict]:
    path = ledger_file(out_root)
    if not path.exists():
        raise FileNotFoundError(f"no ledger at {path}: build the book first (make book)")
    return json.loads(path.read_text())


def book_counts(ledger: Mapping[str, dict]) -> dict[str, int]:
    """Book-wide totals of :data:`SUMMARY_COLUMNS`, plus the number of claims and chapters."""
    totals = dict.fromkeys(SUMMARY_COLUMNS, 0)
    for entry in ledger.values():
        for key, value in count_verdicts(entry["rows"]).items():
            totals[key] += value
    totals["claims"] = sum(totals[v] for v in VERDICTS)
    totals["chapters"] = len(ledger)
    return totals


def _numbers(numbers: Mapping[str, float | None]) -> str:
    """``key = value`` pairs; None (an effect no design of this size detects) shows as "none"."""
    return ", ".join(f"{key} = {'none' if value is None else format(value, '.4g')}"
                     for key, value in numbers.items())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flags(row: Mapping) -> str:
    flags = [flag for flag in ("fragile", "underpowered") if row.get(flag)]
    if row.get("unexpected"):
        flags.insert(0, f"unexpected (expected {row['expected']})")
    if row.get("expected") is None:
        flags.append("not asserted")
    return f" ({', '.join(flags)})" if flags else ""


def _ref(title: str, slug: str) -> str:
    return f"{{ref}}`{title.replace('<', '&lt;')} <ledger-{slug}>`"


def summary_markdown(ledger: Mapping[str, dict]) -> str:
    """The summary table: one row per chapter and a book-wide total."""
    head = "| chapter | " + " | ".join(SUMMARY_COLUMNS) + " |"
    lines = [head, "|---|" + "---|" * len(SUMMARY_COLUMNS)]
    for slug, entry in ledger.items():
        if entry.get("error"):
            lines.append(f"| {_ref(entry['title'], slug)} | failed: "
                         f"{_cell(entry['error'][:120])} |" + " |" * (len(SUMMARY_COLUMNS) - 1))
            continue
        counts = count_verdicts(entry["rows"])
        lines.append(f"| {_ref(entry['title'], slug)} | "
                     + " | ".join(str(counts[c]) for c in SUMMARY_COLUMNS) + " |")
    totals = book_counts(ledger)
    lines.append("| **book** | " + " | ".join(f"**{totals[c]}**" for c in SUMMARY_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def forest_figure(rows: list[dict], title: str):
    """A forest plot of claims with an interval: one panel per claim, each on its own scale.

    Each panel shows the effect in the claim's direction with its interval, coloured by verdict, a
    solid line at the margin the lower bound must clear, a dashed line at the smallest effect of
    interest (when it differs) and a star at the paper's own effect (when given).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icml26.plotting import use_book_style

    use_book_style()
    shown = [row for row in rows if "interval" in row]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(6.4, 0.75 * len(shown) + 0.5),
                             squeeze=False)
    for ax, row in zip(axes[:, 0], shown, strict=True):
        box = row["interval"]
        color = VERDICT_COLORS[row["verdict"]]
        ax.errorbar([box["estimate"]], [0], xerr=[[box["estimate"] - box["lower"]],
                                                  [box["upper"] - box["estimate"]]],
                    fmt="o", color=color, capsize=4)
        ax.axvline(box["margin"], color="black", lw=1)
        if box["smallest_effect"] != box["margin"]:
            ax.axvline(box["smallest_effect"], color="black", lw=1, ls="--")
        if "paper_effect" in row["numbers"]:
            ax.plot([row["numbers"]["paper_effect"]], [0], marker="*", color="black", ms=9)
        label = row["statement"] if len(row["statement"]) < 70 else row["statement"][:67] + "..."
        ax.set_title(f"{label} [{row['verdict']}]", fontsize=8, loc="left", color=color)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="y", visible=False)
    fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def write_forest_plots(ledger: Mapping[str, dict], stage: Path) -> dict[str, str]:
    """Write each chapter's forest plot under ``stage / FOREST_DIR``; return slug -> file name."""
    import matplotlib.pyplot as plt

    folder = stage / FOREST_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for slug, entry in ledger.items():
        fig = forest_figure(claim_rows(entry["rows"]), entry["title"])
        if fig is None:
            continue
        target = folder / f"{slug}.png"
        fig.savefig(target, metadata={"Software": None})
        plt.close(fig)
        written[slug] = target.name
    for stale in folder.glob("*.png"):
        if stale.name not in written.values():
            stale.unlink()
    return written


def ledger_markdown(ledger: Mapping[str, dict], plots: Mapping[str, str] | None = None) -> str:
    """The appendix page's body: the summary, then per chapter its forest plot and claims."""
    plots = plots or {}
    lines = [summary_markdown(ledger), ""]
    for slug, entry in ledger.items():
        rows = entry["rows"]
        lines += [f"(ledger-{slug})=", f"## [{entry['title']}](../chapters/{slug})", ""]
        if entry.get("error"):
            lines += [f"**Failed** at tier {entry['tier']}, seed {entry['seed']}: "
                      f"{_cell(entry['error'])}", ""]
            continue
        counts = count_kinds(rows)
        failed = sum(r["verdict"] == "fails" for r in rows if r["kind"] == "verification")
        lines += [f"Tier {entry['tier']}, seed {entry['seed']}: {counts['paper']} paper claims, "
                  f"{counts['finding']} findings, {counts['verification']} verifications "
                  f"({counts['verification'] - failed} hold).", ""]
        if slug in plots:
            lines += [f"```{{figure}} _ledger/{plots[slug]}",
                      f":alt: Forest plot of the claims of {entry['title']}: each claim's effect "
                      "with its 95% interval against its margin.",
                      "",
                      f"The claims of {entry['title']}: effect in the claim's direction with its "
                      "95% interval, coloured by verdict (green reproduced, orange contradicted, "
                      "grey inconclusive); solid line: the margin; dashed: the smallest effect of "
                      "interest; star: the paper's effect.",
                      "```", ""]
        claims = claim_rows(rows)
        if claims:
            lines += ["| statement | kind | numbers | verdict |", "|---|---|---|---|"]
            for row in claims:
                lines.append(f"| {_cell(row['statement'])} | {row['kind']} | "
                             f"{_cell(_numbers(row['numbers']))} | {row['verdict']}"
                             f"{_flags(row)} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def ledger_text(ledger: Mapping[str, dict]) -> str:
    """The same ledger for a terminal: the summary, then every claim with its numbers."""
    width = max([len(slug) for slug in ledger] + [len("book")])
    header = f"{'chapter':<{width}} " + " ".join(f"{c:>12}" for c in SUMMARY_COLUMNS)
    lines = [header]
    for slug, entry in ledger.items():
        if entry.get("error"):
            lines.append(f"{slug:<{width}} FAILED: {entry['error'].splitlines()[0]}")
            continue
        counts = count_verdicts(entry["rows"])
        lines.append(f"{slug:<{width}} " + " ".join(f"{counts[c]:>12}" for c in SUMMARY_COLUMNS))
    totals = book_counts(ledger)
    lines += [f"{'book':<{width}} " + " ".join(f"{totals[c]:>12}" for c in SUMMARY_COLUMNS), ""]
    for slug, entry in ledger.items():
        counts = count_kinds(entry["rows"])
        if entry.get("error"):
            lines.append(f"{slug} (tier {entry['tier']}, seed {entry['seed']}): FAILED: "
                         f"{entry['error']}")
            continue
        lines.append(f"{slug} (tier {entry['tier']}, seed {entry['seed']}): "
                     f"{counts['paper']} paper, {counts['finding']} finding, "
                     f"{counts['verification']} verification")
        for row in claim_rows(entry["rows"]):
            lines.append(f"  [{row['kind']}] {row['verdict']}{_flags(row)}: {row['statement']}")
            lines.append(f"      {_numbers(row['numbers'])}")
    return "\n".join(lines)


def substitutions(ledger: Mapping[str, dict]) -> dict[str, str]:
    """Book-wide counts for the introduction (MyST substitutions ``{{ ledger_reproduced }}``...)."""
    return {f"ledger_{key}": str(value) for key, value in book_counts(ledger).items()}
