"""Running an exercise's check file against a submission, from outside the submission.

A check file (``tests/labs/<slug>/<label>.py``) sets ``name`` and ``points`` and defines
``test_*`` functions. Each argument of a test is a name from the submission's notebook: a function
arrives as a :class:`RemoteFunction` (calling it asks the submission to call its function on these
inputs and returns the answer as data, see :mod:`icml26.toolchain.wire`), any other value arrives
as data. Two argument names are the runner's own: ``rng``, a NumPy generator seeded from the
grading seed (which the submission never sees), and ``submission``, for
``submission.evaluate(source, **inputs)``. A check file may set ``forbid``, dotted names of
library functions that raise while the submission answers (an exercise that asks for an
implementation of one's own).

The test code, the comparisons, the points and the messages all run here, in the grader's
process; the submission only answers requests, through a :class:`Submission`.
"""

from __future__ import annotations

import builtins
import importlib.util
import inspect
import traceback
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from icml26.toolchain.wire import NamespaceFunction, Request, answer, decode, unpack

RESERVED = ("rng", "submission")
# Exceptions a submission may answer with that checks may expect (``pytest.raises(ValueError)``).
_EXPECTABLE = ("ValueError", "TypeError", "KeyError", "IndexError", "ZeroDivisionError",
               "NotImplementedError", "RuntimeError", "ArithmeticError", "LookupError")


class SubmissionError(Exception):
    """The submission did not answer with data: it raised, ran out of time, died, or answered
    with something that is not data. The message says so for a person."""


_raised: dict[str, type] = {}


def raised(ename: str, message: str) -> SubmissionError:
    """The grader-side exception for a submission that raised ``ename``: a
    :class:`SubmissionError` that is also that built-in exception when a check may expect it."""
    if ename in _EXPECTABLE:
        kind = _raised.setdefault(ename, type(f"Submission{ename}",
                                              (SubmissionError, getattr(builtins, ename)), {}))
    else:
        kind = SubmissionError
    return kind(message)


class Submission(Protocol):
    """Something that answers requests for values: a kernel, or a notebook's own namespace."""

    def ask(self, request: Request) -> object:
        """The answer's value; a :class:`SubmissionError` if there is no data to return."""


def unwrap(what: str, decoded: dict) -> object:
    """The value of a decoded answer about ``what``, or the submission's error raised here."""
    if "ok" in decoded:
        return decoded["ok"]
    ename, message = decoded["error"]
    if ename == "DataError":
        raise SubmissionError(f"{what} did not answer with data: {message}")
    raise raised(ename, f"{what} raised {ename}" + (f": {message}" if message else ""))


class LocalSubmission:
    """The notebook's own namespace answering in-process, through the same wire (what
    ``check("LABEL")`` uses inside a notebook: feedback for its author, not a grade)."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace

    def ask(self, request: Request) -> object:
        text = answer(unpack(request.pack()), self.namespace)
        return unwrap(request.subject, decode(text))


class RemoteFunction:
    """A function of the submission, called by the check from the grader's process."""

    def __init__(self, submission: Submission, name: str, forbid: tuple[str, ...] = ()) -> None:
        self.submission, self.name, self.forbid = submission, name, forbid

    def __call__(self, *args, **kwargs) -> object:
        return self.submission.ask(Request("call", self.name, args, kwargs, forbid=self.forbid))

    def map(self, calls: Iterable[tuple]) -> list:
        """``[f(*args) for args in calls]`` in one request (many small calls at once)."""
        source = "[__function(*__args) for __args in __calls]"
        return self.submission.ask(Request(
            "evaluate", source=source, forbid=self.forbid, about=self.name,
            kwargs={"__function": NamespaceFunction(self.name),
                    "__calls": [tuple(c) for c in calls]}))

    def __reduce__(self):  # handed to the submission as an argument: its own function by name
        return (NamespaceFunction, (self.name,))

    def __repr__(self) -> str:
        return f"<the submission's {self.name}>"


class Evaluator:
    """The ``submission`` argument of a test: ``evaluate(source, **inputs)`` runs ``source`` in
    the submission's namespace with ``inputs`` bound and returns its last expression's value."""

    def __init__(self, submission: Submission, forbid: tuple[str, ...]) -> None:
        self._submission, self._forbid = submission, forbid

    def evaluate(self, source: str, **inputs) -> object:
        if not isinstance(source, str):
            raise TypeError(f"source must be a string, got {type(source).__name__}")
        return self._submission.ask(Request("evaluate", source=source, kwargs=inputs,
                                            forbid=self._forbid))


@dataclass(frozen=True)
class CheckFile:
    """One exercise's checks, loaded (with everything they import) before any submission runs."""

    label: str
    points: float
    tests: tuple[Callable, ...]
    forbid: tuple[str, ...]
    path: Path


def load_check(path: Path) -> CheckFile:
    """Import a check file: its ``name``, ``points``, ``forbid`` and ``test_*`` functions."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"icml26_lab_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    points = getattr(module, "points", 1)
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
        raise ValueError(f"{path}: points must be a positive number, got {points!r}")
    tests = tuple(f for n, f in vars(module).items() if n.startswith("test_") and callable(f))
    if not tests:
        raise ValueError(f"{path}: no test_* functions")
    return CheckFile(getattr(module, "name", path.stem), float(points), tests,
                     tuple(getattr(module, "forbid", ())), path)


@dataclass(frozen=True)
class CheckResult:
    exercise: str
    passed: bool
    message: str


def _title(test: Callable) -> str:
    return f"check '{test.__name__.removeprefix('test_').replace('_', ' ')}'"


def _assertion(test: Callable, error: AssertionError) -> str:
    text = str(error)
    if text:
        return f"{_title(test)} failed: {text}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.name == test.__name__]
    line = frames[-1].line if frames else ""
    return f"{_title(test)} failed at `{line}`" if line else f"{_title(test)} failed"


def test_rng(seed: int, label: str, test: Callable) -> np.random.Generator:
    """The generator a test draws its inputs from: the grading seed, the exercise and the test."""
    return np.random.default_rng([seed, zlib.crc32(f"{label}/{test.__name__}".encode())])


def run_check(check: CheckFile, submission: Submission, seed: int) -> CheckResult:
    """Run every test of ``check`` against ``submission``; the first failure decides."""
    for test in check.tests:
        names = list(inspect.signature(test).parameters)
        wanted = tuple(n for n in names if n not in RESERVED)
        try:
            described = submission.ask(Request("describe", names=wanted)) if wanted else {}
        except SubmissionError as error:
            return CheckResult(check.label, False, f"{_title(test)}: {error}")
        arguments = {"rng": test_rng(seed, check.label, test),
                     "submission": Evaluator(submission, check.forbid)}
        for name in wanted:
            entry = described.get(name) if isinstance(described, dict) else None
            if entry == "callable":
                arguments[name] = RemoteFunction(submission, name, check.forbid)
            elif isinstance(entry, list) and len(entry) == 2 and entry[0] == "value":
                arguments[name] = entry[1]
        missing = [n for n in wanted if n not in arguments]
        if missing:
            return CheckResult(check.label, False, f"define {', '.join(missing)} first")
        try:
            test(*(arguments[name] for name in names))
        except NotImplementedError:
            return CheckResult(check.label, False, "not implemented yet")
        except SubmissionError as error:
            return CheckResult(check.label, False, f"{_title(test)}: {error}")
        except AssertionError as error:
            return CheckResult(check.label, False, _assertion(test, error))
        except Exception as error:  # a wrong type or shape in the answer, reported per check
            last = traceback.format_exception_only(error)[-1].strip()
            return CheckResult(check.label, False, f"{_title(test)} could not use the answer: "
                                                   f"{last}")
    count = len(check.tests)
    return CheckResult(check.label, True, f"all {count} check{'s' * (count != 1)} passed")
