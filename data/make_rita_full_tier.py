"""Write data/rita_full_tier.json: the rita chapter's claims rows from one run of its full tier.

The full tier trains 32 mini-CLIPs with 64 views and runs the adaptive attacks on 300 images of
each, about 25 minutes on one core: too long for the book build, which runs the book tier. The
chapter shows the stored rows of one full-tier run beside its own. Run from the repository
root, on a tree without uncommitted changes:
    .venv/bin/python data/make_rita_full_tier.py
It executes the chapter at the full tier, seed 0 (`icml26 run`), and records the commit it ran
on. To store a notebook already executed at the full tier, name it and the commit it ran on:
    .venv/bin/python data/make_rita_full_tier.py NOTEBOOK --commit SHA
`icml26.claims.load_stored_run` reads the file; `tests/test_rita.py` checks it against the chapter.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import nbformat

from icml26.toolchain.ledger import chapter_rows

ROOT = Path(__file__).resolve().parents[1]
GLUED = ("n_models", "rita_paired_predictions", "n_extra_models", "n_adapt_per_model",
         "acc_adv_rita", "acc_adv_ensemble", "acc_adv_ot_views", "acc_worst_case_rita",
         "acc_worst_case_zeroshot", "models_needed_ensemble")


def glued_values(notebook) -> dict[str, float]:
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get("application/papermill.record/text/plain")
            if name in GLUED and text is not None:
                values[name] = float(text)
    return values


def main() -> None:
    args = sys.argv[1:]
    if args:
        if len(args) != 3 or args[1] != "--commit":
            raise SystemExit("usage: make_rita_full_tier.py [NOTEBOOK --commit SHA]")
        path, commit = Path(args[0]), args[2]
    else:
        changes = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=ROOT, capture_output=True, text=True, check=True).stdout
        if changes.strip():
            raise SystemExit("commit or stash the changes first: the file records the commit")
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        path = ROOT / "_build" / "rita_full_tier.ipynb"
        subprocess.run([str(Path(sys.executable).with_name("icml26")), "run", "rita", "--tier",
                        "full", "--seed", "0", "--output", str(path), "--no-cache"], cwd=ROOT,
                       check=True)
    notebook = nbformat.read(path, as_version=4)
    parameters = notebook.metadata.get("papermill", {}).get("parameters", {})
    if parameters.get("TIER") != "full":
        raise SystemExit(f"{path} was not executed at the full tier: {parameters}")
    rows = [dict(kind=r["kind"], statement=r["statement"], verdict=r["verdict"],
                 expected=r["expected"], fragile=r["fragile"],
                 **{k: r["numbers"][k] for k in ("estimate", "lower", "upper", "mde", "margin",
                                                  "pairs") if k in r["numbers"]})
            for r in chapter_rows(path) if r["kind"] != "verification"]
    record = dict(chapter="rita", tier="full", seed=int(parameters.get("SEED", 0)), commit=commit,
                  wall_minutes=round(notebook.metadata["papermill"]["duration"] / 60, 1),
                  glued=glued_values(notebook), rows=rows)
    out = ROOT / "data" / "rita_full_tier.json"
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(out, hashlib.sha256(out.read_bytes()).hexdigest())


if __name__ == "__main__":
    main()
