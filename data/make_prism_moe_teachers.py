"""Write data/prism_moe_teachers.pt: the prism-moe chapter's dense models (state dicts).

Run from the repository root with the project's environment:
    .venv/bin/python data/make_prism_moe_teachers.py
It trains six small dense class-conditional next-scale models (`icml26.prism_moe.VARLite`,
seeds 0, 1000, ..., 5000) with the recipe `icml26.prism_moe.TEACHER_RECIPE` (600 AdamW steps
at lr 6e-3 on a fixed stratified 80% split of scikit-learn's 8x8 digits, one torch thread,
about 3 minutes) and saves their state dicts with the seeds and the recipe. The chapter keeps the
models whose class-conditional samples a fixed classifier reads at 85% or more, and asserts it.
The training is `icml26.prism_moe.main`, which the tests run on a few steps.
"""

import hashlib
import sys
from pathlib import Path

from icml26 import prism_moe

path = Path(__file__).with_name("prism_moe_teachers.pt")
prism_moe.main(["--out", str(path), *sys.argv[1:]])
print(path, hashlib.sha256(path.read_bytes()).hexdigest())
