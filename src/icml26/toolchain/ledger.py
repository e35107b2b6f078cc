"""The "What reproduced" ledger: every check of every executed chapter, gathered by kind.

The build reads the rows that :mod:`icml26.claims` stores in the output metadata of each executed
notebook, writes them to ``_build/claims.json`` (what ``icml26 claims`` prints) and renders the
appendix page: per chapter, each paper claim and finding with its numbers and verdict, and the
count of verifications.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import nbformat

from icml26.claims import KINDS, collect_rows

LEDGER_TABLE = "book/appendix/_reproduced_table.md"  # written by the build, included by the page


def chapter_rows(notebook_path: Path) -> list[dict]:
    """The check rows an executed notebook displays."""
    return collect_rows(nbformat.read(notebook_path, as_version=4))


def count_kinds(rows: list[dict]) -> dict[str, int]:
    """How many rows of each kind (every kind present, zero when absent)."""
    counts = dict.fromkeys(KINDS, 0)
    for row in rows:
        counts[row["kind"]] += 1
    return counts


def ledger_file(out_root: Path) -> Path:
    return out_root / "_build" / "claims.json"


def save_ledger(ledger: Mapping[str, dict], out_root: Path) -> None:
    """Store ``{slug: {"title", "tier", "seed", "rows"}}`` for ``icml26 claims``."""
    path = ledger_file(out_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(ledger, indent=1))


def load_ledger(out_root: Path) -> dict[str, dict]:
    path = ledger_file(out_root)
    if not path.exists():
        raise FileNotFoundError(f"no ledger at {path}: build the book first (make book)")
    return json.loads(path.read_text())


def _numbers(numbers: Mapping[str, float]) -> str:
    return ", ".join(f"{key} = {value:.4g}" for key, value in numbers.items())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def ledger_markdown(ledger: Mapping[str, dict]) -> str:
    """The appendix page's body: one section per chapter, claims and findings in a table."""
    lines = []
    for slug, entry in ledger.items():
        rows = entry["rows"]
        counts = count_kinds(rows)
        verifications = [r for r in rows if r["kind"] == "verification"]
        failed = sum(not r["holds"] for r in verifications)
        lines += [f"## [{entry['title']}](../chapters/{slug})", "",
                  f"Tier {entry['tier']}, seed {entry['seed']}: {counts['paper']} paper claims, "
                  f"{counts['finding']} findings, {counts['verification']} verifications "
                  f"({counts['verification'] - failed} hold).", ""]
        claims = [r for r in rows if r["kind"] != "verification"]
        if claims:
            lines += ["| statement | kind | numbers | verdict |", "|---|---|---|---|"]
            for row in claims:
                verdict = row["verdict"] + (" (reported, not asserted)"
                                            if row.get("expected") is None else "")
                lines.append(f"| {_cell(row['statement'])} | {row['kind']} | "
                             f"{_cell(_numbers(row['numbers']))} | {verdict} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def ledger_text(ledger: Mapping[str, dict]) -> str:
    """The same ledger for a terminal."""
    lines = []
    for slug, entry in ledger.items():
        counts = count_kinds(entry["rows"])
        lines.append(f"{slug} (tier {entry['tier']}, seed {entry['seed']}): "
                     f"{counts['paper']} paper, {counts['finding']} finding, "
                     f"{counts['verification']} verification")
        for row in entry["rows"]:
            if row["kind"] != "verification":
                lines.append(f"  [{row['kind']}] {row['verdict']}: {row['statement']}")
                lines.append(f"      {_numbers(row['numbers'])}")
    return "\n".join(lines)
