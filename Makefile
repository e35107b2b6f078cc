# The two commands of the README: `make book` and `make test`. Each sets up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TIER ?= book
SEED ?= 0
# Chapters executed at once (empty: half the cores); `make book JOBS=4`.
JOBS ?=
JOBS_FLAG := $(if $(JOBS),--jobs $(JOBS))
# `make book STRICT=1` also fails on an unexpected or fragile expected verdict (what CI runs).
STRICT ?=
STRICT_FLAG := $(if $(STRICT),--strict-claims)
# Sleeping (not spinning) OpenMP threads: torch stays fast when the cores are shared.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: book student-book test lab env lint lock clean

book: $(STAMP)
	$(BIN)/icml26 build --tier $(TIER) --seed $(SEED) $(JOBS_FLAG) $(STRICT_FLAG)

# The student edition: the same executed chapters with every exercise solution removed.
student-book: $(STAMP)
	$(BIN)/icml26 build --student --tier $(TIER) --seed $(SEED) $(JOBS_FLAG)

# Work in the chapters live: JupyterLab opens each MyST chapter as a notebook (saved back as MyST).
lab: $(STAMP)
	$(BIN)/icml26 lab

test: $(STAMP)
	$(BIN)/python -m pytest

env: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Packages installed without their dependencies (requirements/nodeps.txt), kept out of the lock.
NODEPS := $(shell sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' requirements/nodeps.txt | paste -sd'|')

# Install the exact pins, then the data packages and the package itself without touching them.
$(STAMP): requirements/lock.txt requirements/nodeps.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing the pinned environment into $(VENV) (first run: a few minutes)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
	  -r requirements/nodeps.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -c "from icml26.toolchain.offline import mathjax_dir; print('MathJax:', mathjax_dir())"
	@touch $(STAMP)

# Re-pin after changing dependencies in pyproject.toml (then update environment.yml to match).
lock: $(STAMP)
	@{ sed -n '1,2p' requirements/lock.txt; $(BIN)/python -m pip freeze --exclude-editable \
	  | grep -v '^icml26' | grep -viE '^($(NODEPS))[ =]' | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements/lock.new
	@mv requirements/lock.new requirements/lock.txt

clean:
	rm -rf _build
