"""``icml26 verdicts``: run chapters on several seeds and show which verdicts flip.

Each (chapter, seed) pair executes at the given tier (reusing the build's cache), in parallel
with ``jobs``; the verdict of every paper claim and finding is then listed per seed. A claim whose
verdict differs between seeds is marked: its design cannot decide it at this tier.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from icml26.toolchain import ledger, pipeline
from icml26.toolchain.chapters import ROOT, Chapter, PipelineError


@dataclass
class SeedRuns:
    """One chapter's claims on each seed: ``rows[seed]`` (or ``errors[seed]`` if it failed)."""

    slug: str
    rows: dict[int, list[dict]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    def table(self) -> list[tuple[str, str, dict[int, str], bool]]:
        """(kind, statement, verdict per seed, flips) for every paper claim and finding."""
        seeds = sorted(self.rows)
        statements: dict[tuple[str, str], dict[int, str]] = {}
        for seed in seeds:
            for row in ledger.claim_rows(self.rows[seed]):
                mark = "*" if row.get("fragile") else ""
                statements.setdefault((row["kind"], row["statement"]), {})[seed] = (
                    row["verdict"] + mark)
        return [(kind, statement, verdicts,
                 len({v.rstrip("*") for v in verdicts.values()}) > 1 or len(verdicts) < len(seeds))
                for (kind, statement), verdicts in statements.items()]


def _output(out_root: Path, tier: str, seed: int, slug: str) -> Path:
    return out_root / "_build" / "verdicts" / tier / f"seed-{seed}" / f"{slug}.ipynb"


def run_seeds(
    selected: list[Chapter], tier: str, seeds: list[int], *, jobs: int = 1,
    use_cache: bool = True, out_root: Path = ROOT, root: Path = ROOT,
    report: Callable[[str], None] = print,
) -> list[SeedRuns]:
    """Execute every chapter of ``selected`` on every seed; return their claims per seed."""
    for seed in seeds:
        pipeline.validate_parameters(tier, seed)
    cache = pipeline.cache_dir(out_root)
    results = {c.slug: SeedRuns(c.slug) for c in selected}
    pending = []
    for chapter in selected:
        for seed in seeds:
            output = _output(out_root, tier, seed, chapter.slug)
            output.parent.mkdir(parents=True, exist_ok=True)
            cached = (pipeline.cached_run(chapter, tier, seed, output, cache)
                      if use_cache else None)
            if cached:
                results[chapter.slug].rows[seed] = ledger.chapter_rows(output)
                report(f"{chapter.slug}, seed {seed}: cached")
            else:
                pending.append((chapter, seed))

    def finish(chapter: Chapter, seed: int, run: Callable[[], tuple[float, bytes]]) -> None:
        output = _output(out_root, tier, seed, chapter.slug)
        try:
            seconds, notebook = run()
        except PipelineError as error:
            results[chapter.slug].errors[seed] = str(error)
            report(f"{chapter.slug}, seed {seed}: FAILED: {error}")
            return
        output.write_bytes(notebook)
        pipeline.store_run(chapter, tier, seed, output, seconds, cache)
        results[chapter.slug].rows[seed] = ledger.chapter_rows(output)
        report(f"{chapter.slug}, seed {seed}: {seconds:.1f} s")

    if jobs == 1:
        for chapter, seed in pending:
            report(f"{chapter.slug}, seed {seed}: executing at {tier} tier")
            finish(chapter, seed, lambda c=chapter, s=seed: pipeline.execute_chapter_task(
                c.slug, tier, s, str(root)))
    elif pending:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(pipeline.execute_chapter_task, c.slug, tier, s, str(root)):
                       (c, s) for c, s in pending}
            for chapter, seed in pending:
                report(f"{chapter.slug}, seed {seed}: executing at {tier} tier")
            for future in as_completed(futures):
                chapter, seed = futures[future]
                finish(chapter, seed, future.result)
    return [results[c.slug] for c in selected]


def verdicts_text(runs: list[SeedRuns], seeds: list[int], width: int = 70) -> str:
    """The per-seed verdicts of every claim, flips marked, and a count of flips."""
    lines, flips, total = [], 0, 0
    header = "  ".join(f"{'seed ' + str(s):<14}" for s in seeds)
    for chapter in runs:
        lines += ["", chapter.slug]
        for seed, error in sorted(chapter.errors.items()):
            lines.append(f"  seed {seed} FAILED: {error.splitlines()[0]}")
        if not chapter.rows:
            continue
        lines.append(f"  {'kind':<8} {header}  {'flips':<5}  statement")
        for kind, statement, verdicts, flipped in chapter.table():
            total += 1
            flips += flipped
            cells = "  ".join(f"{verdicts.get(s, '-'):<14}" for s in seeds)
            text = statement if len(statement) <= width else statement[:width - 3] + "..."
            lines.append(f"  {kind:<8} {cells}  {'FLIPS' if flipped else '':<5}  {text}")
    lines += ["", f"{flips} of {total} paper claims and findings change verdict between seeds "
              f"{', '.join(map(str, seeds))} (* marks a fragile verdict)."]
    return "\n".join(lines)
