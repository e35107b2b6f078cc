"""The pins: one lock file, mirrored by environment.yml, covering pyproject's dependencies."""

import re
import tomllib

import yaml

from icml26.toolchain.chapters import ROOT

CONDA_TO_PIP = {"pytorch": "torch"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _lock() -> dict[str, str]:
    lines = (ROOT / "requirements" / "lock.txt").read_text().splitlines()
    pins = [ln for ln in lines if ln and not ln.startswith("#")]
    assert all("==" in ln for ln in pins), "every lock line must be an exact pin"
    return {_name(ln): ln.split("==")[1] for ln in pins}


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
    for tool in ("papermill", "jupytext", "gpytorch", "matplotlib", "ruff", "pytest"):
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
