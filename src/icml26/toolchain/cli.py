"""The ``icml26`` command: list, run and build the book's chapters.

    icml26 list                                # chapters, parts, tiers and last runtimes
    icml26 run mod-test --tier smoke --seed 3  # execute one chapter into an .ipynb
    icml26 build --tier book                   # what `make book` calls
    icml26 build --jobs 4                      # four chapters at once (default: cores/2, min 2)
    icml26 build --dask tcp://host:8786        # one task per chapter on a Dask cluster
    icml26 build --student                     # the student edition (solutions removed)
    icml26 export --student [SLUG ...]         # lab notebooks with stubs for the exercises
    icml26 check mod-test my-notebook.ipynb    # grade a lab notebook, exercise by exercise
    icml26 grade mod-test submissions/ --out grades.csv   # grade a class into a gradebook
    icml26 build --strict-claims               # also fail on unexpected or fragile verdicts
    icml26 claims                              # the "What reproduced" ledger of the last build
    icml26 verdicts mod-test rita --seeds 0 1 2  # which verdicts flip between seeds
    icml26 lab [JUPYTERLAB OPTIONS]            # JupyterLab with the chapters as notebooks
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from icml26.core import TIERS
from icml26.toolchain import failures, grading, lab, labs, ledger, pipeline, verdicts
from icml26.toolchain.chapters import PACKAGE_DIR, checkout_of


def _seed(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"seed must be a non-negative integer, got {text!r}")
    return int(text)


def _tier(text: str) -> str:
    if text not in TIERS:
        raise ValueError(f"unknown tier {text!r}; valid tiers: {', '.join(TIERS)}")
    return text


def _runtime(run: dict | None) -> str:
    """One tier's last run for ``icml26 list``: its seconds, "failed" or "-"."""
    if run is None:
        return "-"
    return "failed" if run.get("error") else f"{run['seconds']:.1f}"


def list_lines(history: dict[str, dict[str, dict]], chapter_list: list) -> list[str]:
    """``icml26 list``: one aligned row per chapter (slug, part, last runtime per tier), then
    every chapter whose last run failed, with the reason."""
    rows = [["chapter", "part", *(f"{tier} (s)" for tier in TIERS)]]
    failed = []
    for chapter in chapter_list:
        runs = history.get(chapter.slug, {})
        rows.append([chapter.slug, chapter.part, *(_runtime(runs.get(t)) for t in TIERS)])
        failed += [f"{chapter.slug} ({t}): {runs[t]['error'].splitlines()[0]}"
                   for t in TIERS if runs.get(t, {}).get("error")]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join([row[0].ljust(widths[0]), row[1].ljust(widths[1]),
                        *(cell.rjust(w) for cell, w in zip(row[2:], widths[2:], strict=True))])
             .rstrip() for row in rows]
    return lines + (["", "failed:", *(f"  {line}" for line in failed)] if failed else [])


def _list(_: argparse.Namespace) -> None:
    print("\n".join(list_lines(pipeline.load_history(), pipeline.chapters())))


def _run(args: argparse.Namespace) -> None:
    chapter = pipeline.find_chapter(args.slug)
    tier, seed = _tier(args.tier), _seed(args.seed)
    default = pipeline.ROOT / "_build" / "executed" / tier / f"{args.slug}.ipynb"
    output = Path(args.output) if args.output else default
    print(f"{chapter.slug}: executing at {tier} tier, seed {seed}", flush=True)
    start = time.perf_counter()
    try:
        record = pipeline.run_chapter(chapter, tier, seed, output, use_cache=not args.no_cache)
    except failures.ChapterError as error:
        pipeline.save_history([pipeline.failed_record(chapter, tier, seed,
                                                      time.perf_counter() - start, str(error))])
        if output.exists():
            print(f"{chapter.slug}: the notebook as far as it executed: {output}")
        if error.line:
            print(f"{chapter.slug}: the failing cell starts at {chapter.source}:{error.line}")
        raise
    pipeline.save_history([record])
    source = "cache" if record.cached else "fresh run"
    counts = record.claims
    print(f"{chapter.slug}: {record.seconds:.1f} s ({source}), {counts['paper']} paper claims, "
          f"{counts['finding']} findings, {counts['verification']} verifications; wrote {output}")


def _build(args: argparse.Namespace) -> None:
    out_root = Path(args.out_root).resolve() if args.out_root else pipeline.ROOT
    tier, seed = _tier(args.tier), _seed(args.seed)
    jobs = None if args.jobs is None else pipeline.validate_jobs(args.jobs)
    pipeline.build(tier, seed, out_root=out_root, use_cache=not args.no_cache,
                   student=args.student, jobs=jobs, dask=args.dask,
                   strict_claims=args.strict_claims, report=lambda line: print(line, flush=True))


def _export(args: argparse.Namespace) -> None:
    selected = [pipeline.find_chapter(s) for s in args.slugs] or pipeline.chapters()
    edition = "student" if args.student else "instructor"
    out_dir = Path(args.out or pipeline.ROOT / "_build" / "labs" / edition)
    for chapter in selected:
        print(f"{chapter.slug}: wrote {labs.export_chapter(chapter, out_dir, args.student)}")


def _limits(args: argparse.Namespace) -> grading.Limits:
    return grading.Limits(cell_seconds=_positive(args.cell_timeout, "--cell-timeout"),
                          submission_seconds=_positive(args.timeout, "--timeout"),
                          memory_mib=_positive(args.memory, "--memory"))


def _positive(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{option} must be a positive number, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"{option} must be a positive number, got {text!r}")
    return value


def _grading_seed(args: argparse.Namespace) -> int | None:
    return None if args.seed is None else _seed(args.seed)


def _check(args: argparse.Namespace) -> int:
    notebook = Path(args.notebook)
    if not notebook.is_file():
        raise ValueError(f"no such notebook: {notebook}")
    grade = grading.grade_submission(args.slug, notebook, _tier(args.tier), _limits(args),
                                     seed=_grading_seed(args))
    if grade.error:
        raise ValueError(f"{notebook}: {grade.error}")
    for result in grade.exercises:
        print(f"{'PASS' if result.passed else 'FAIL'}  {result.exercise} "
              f"({result.points:g}/{result.max_points:g}): {result.message}")
    passed = sum(r.passed for r in grade.exercises)
    print(f"{passed} passed, {len(grade.exercises) - passed} failed")
    return 0 if passed == len(grade.exercises) else 1


def _grade(args: argparse.Namespace) -> int:
    jobs = None if args.jobs is None else pipeline.validate_jobs(args.jobs)
    grades = grading.grade_folder(args.slug, Path(args.submissions), tier=_tier(args.tier),
                                  limits=_limits(args), jobs=jobs, seed=_grading_seed(args),
                                  report=lambda line: print(line, flush=True))
    target = grading.write_gradebook(grades, Path(args.out))
    print(grading.summary_table(grades))
    print(f"wrote {target}")
    return 0


def _claims(args: argparse.Namespace) -> None:
    out_root = Path(args.out_root).resolve() if args.out_root else pipeline.ROOT
    try:
        print(ledger.ledger_text(ledger.load_ledger(out_root)))
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None


def _verdicts(args: argparse.Namespace) -> int:
    if args.all == bool(args.slugs):
        raise ValueError("name chapters or give --all (not both)")
    selected = pipeline.chapters() if args.all else [pipeline.find_chapter(s) for s in args.slugs]
    seeds = [_seed(s) for s in args.seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct seeds, got {' '.join(args.seeds) or 'none'}")
    jobs = 1 if args.jobs is None else pipeline.validate_jobs(args.jobs)
    runs = verdicts.run_seeds(selected, _tier(args.tier), seeds, jobs=jobs,
                              use_cache=not args.no_cache,
                              report=lambda line: print(line, flush=True))
    print(verdicts.verdicts_text(runs, seeds))
    return 1 if any(run.errors for run in runs) else 0


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="icml26", description="Run and build ICML 2026 in Code.")
    commands = main.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="chapters, their parts and last runtimes").set_defaults(
        handler=_list)
    run = commands.add_parser("run", help="execute one chapter with papermill")
    run.add_argument("slug")
    run.add_argument("--output", help="executed notebook (default _build/executed/TIER/SLUG.ipynb)")
    build = commands.add_parser("build", help="execute every chapter and render the HTML book")
    build.add_argument("--out-root", help="folder that receives _build/ (default: the repository)")
    build.add_argument("--student", action="store_true",
                       help="render the student edition (solutions removed) instead")
    build.add_argument("--jobs", help="chapters executed at once (default: cores / 2, at least 2)")
    build.add_argument("--strict-claims", action="store_true",
                       help="also fail on an unexpected verdict or a fragile expected one")
    build.add_argument("--dask", metavar="ADDRESS",
                       help="execute on the Dask scheduler at ADDRESS (workers need a checkout)")
    export = commands.add_parser("export", help="write lab notebooks (student or instructor)")
    edition = export.add_mutually_exclusive_group(required=True)
    edition.add_argument("--student", action="store_true", help="solutions replaced by stubs")
    edition.add_argument("--instructor", action="store_true", help="solutions included")
    export.add_argument("slugs", nargs="*", help="chapters (default: all)")
    export.add_argument("--out", help="folder (default _build/labs/student or .../instructor)")
    export.set_defaults(handler=_export)
    check = commands.add_parser("check", help="grade a lab notebook exercise by exercise")
    check.add_argument("slug")
    check.add_argument("notebook")
    check.set_defaults(handler=_check)
    grade = commands.add_parser("grade", help="grade every submission in a folder into a CSV")
    grade.add_argument("slug")
    grade.add_argument("submissions", help="folder of submitted notebooks")
    grade.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv)")
    grade.add_argument("--jobs", help="submissions graded at once (default: half the cores)")
    grade.set_defaults(handler=_grade)
    for sub in (check, grade):
        sub.add_argument("--tier", default="smoke", help="tier to run the notebook at")
        sub.add_argument("--cell-timeout", default="120", help="seconds per cell (default 120)")
        sub.add_argument("--timeout", default="900", help="seconds per submission (default 900)")
        sub.add_argument("--memory", default="4096", help="MiB of memory per kernel (4096)")
        sub.add_argument("--seed", help="grading seed of the checks' inputs (default: a fresh "
                                        "one per submission, written in the gradebook)")
    claims = commands.add_parser("claims", help="print the ledger of checks of the last build")
    claims.add_argument("--out-root", help="folder holding _build/ (default: the repository)")
    claims.set_defaults(handler=_claims)
    seeds = commands.add_parser("verdicts", help="run chapters on several seeds; show flips")
    seeds.add_argument("slugs", nargs="*", help="chapters")
    seeds.add_argument("--all", action="store_true", help="every chapter")
    seeds.add_argument("--seeds", nargs="+", default=["0", "1", "2"], help="(default 0 1 2)")
    seeds.add_argument("--tier", default="book", help=f"one of {', '.join(TIERS)} (default book)")
    seeds.add_argument("--jobs", help="chapter runs at once (default 1)")
    seeds.add_argument("--no-cache", action="store_true", help="execute even if cached")
    seeds.set_defaults(handler=_verdicts)
    # `icml26 lab OPTIONS...` passes every option to JupyterLab (handled in main, not parsed here)
    commands.add_parser("lab", help="JupyterLab at the repository, chapters as notebooks")
    for sub, handler in ((run, _run), (build, _build)):
        sub.add_argument("--tier", default="book", help=f"one of {', '.join(TIERS)} (default book)")
        sub.add_argument("--seed", default="0", help="non-negative integer (default 0)")
        sub.add_argument("--no-cache", action="store_true", help="execute even if cached")
        sub.set_defaults(handler=handler)
    return main


def follow_checkout(argv: list[str], cwd: Path | None = None) -> None:
    """Run this command with the ``icml26`` of the checkout the caller stands in (its chapters
    and its library), when that is another checkout than this package's and ``ICML26_ROOT``
    does not name the book; returns only when nothing needs to change."""
    here = checkout_of(cwd or Path.cwd())
    if here is None or "ICML26_ROOT" in os.environ or here == PACKAGE_DIR.parents[1]:
        return
    path = os.pathsep.join(filter(None, [str(here / "src"), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "icml26.toolchain.cli", *argv]
    os.execve(command[0], command, {**os.environ, "PYTHONPATH": path})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    follow_checkout(argv)
    if argv[:1] == ["lab"]:
        lab.start_lab(argv[1:])  # replaces this process
    args = parser().parse_args(argv)
    try:
        status = args.handler(args) or 0
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
        return status
    except (ValueError, pipeline.PipelineError) as error:
        print(f"icml26: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `icml26 list | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush must not fail again
        return 1


if __name__ == "__main__":
    sys.exit(main())
