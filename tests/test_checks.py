"""The wire between grader and submission, and the check runner, without a kernel."""

from __future__ import annotations

import base64
import io
import json
from fractions import Fraction

import numpy as np
import pytest
import torch

import icml26.transductive_online as to
from icml26.toolchain import checks, wire

CHECK = '''
import numpy as np
import pytest

name = "demo"
points = 2
forbid = ("icml26.transductive_online.minimax_mistakes",)


def test_values(square, offset, rng):
    x = rng.normal(size=5)
    assert np.allclose(square(x), x**2 + offset), "square is wrong"
    with pytest.raises(ValueError):
        square("not an array")


def test_silent(square):
    assert square(np.array([3.0]))[0] == 9.0
'''


def _answer(value):
    return wire.decode(wire.encode(value))["ok"]


def test_data_round_trips_exactly():
    value = {"a": [1, 2.5, None, True], (1, 2): (Fraction(1, 3), "x"), 3: float("nan"),
             "array": np.arange(6).reshape(2, 3), "tensor": torch.ones(2, dtype=torch.float64)}
    back = _answer(value)
    assert back["a"] == [1, 2.5, None, True] and back[(1, 2)] == (Fraction(1, 3), "x")
    assert np.isnan(back[3]) and np.array_equal(back["array"], value["array"])
    assert isinstance(back["tensor"], torch.Tensor) and torch.equal(back["tensor"], value["tensor"])
    assert _answer(np.float32(0.5)) == 0.5 and type(_answer(np.int64(3))) is int


class _AlwaysEqual:
    def __eq__(self, other):
        return True


class _Int(int):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [_AlwaysEqual(), _Int(3), [1, _Int(2)], {"x": object()},
                                   np.array([object()], dtype=object), lambda: 1])
def test_only_data_can_be_sent_back(value):
    with pytest.raises(wire.DataError, match="not data"):
        wire.encode(value)


def _npy_text(array, allow_pickle=False) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("text", [
    json.dumps({"ok": {"ndarray": _npy_text(np.array([{"a": 1}], dtype=object), True)}}),
    json.dumps({"ok": {"nothing": 1}}),
    json.dumps({"ok": {"a": 1}}),
    json.dumps({"ok": 1, "extra": 2}),
    json.dumps({"ok": {"fraction": [1, 0]}}),
    json.dumps({"ok": {"dict": [[{"ndarray": _npy_text(np.ones(2))}, 1]]}}),
    "[1, 2]", "not json", json.dumps({"ok": "x" * (wire.MAX_ANSWER_BYTES + 1)}),
])
def test_decode_refuses_anything_but_data(text):
    with pytest.raises(wire.DataError):
        wire.decode(text)


def test_errors_travel_as_name_and_message():
    request = wire.Request("call", "f", (1,))
    text = wire.answer(request, {"f": lambda x: 1 / 0})
    assert wire.decode(text) == {"error": ["ZeroDivisionError", "division by zero"]}


def test_forbidden_functions_raise_while_answering_and_come_back(tmp_path):
    saved = to.minimax_mistakes  # a reference taken before: it raises too
    request = wire.Request("call", "solve", (np.eye(2, dtype=int),),
                           forbid=("icml26.transductive_online.minimax_mistakes",))
    error = wire.decode(wire.answer(request, {"solve": lambda m: saved(m)}))["error"]
    assert error[0] == "RuntimeError" and "minimax_mistakes is not allowed" in error[1]
    assert to.minimax_mistakes(np.eye(2, dtype=int)) == 1


@pytest.fixture
def check_file(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(CHECK)
    return checks.load_check(path)


def _square(x):
    if not isinstance(x, np.ndarray):
        raise ValueError("an array, please")
    return x**2


def test_a_correct_submission_passes(check_file):
    result = checks.run_check(check_file, checks.LocalSubmission({"square": _square,
                                                                  "offset": 0.0}), seed=1)
    assert result.passed and result.message == "all 2 checks passed"
    assert check_file.points == 2.0


@pytest.mark.parametrize("namespace, message", [
    ({"square": _square}, "define offset first"),
    ({"square": lambda x: (_ for _ in ()).throw(NotImplementedError()), "offset": 0.0},
     "not implemented yet"),
    ({"square": _square, "offset": 1.0}, "check 'values' failed: square is wrong"),
    ({"square": lambda x: x**2 if isinstance(x, np.ndarray) else None + 1, "offset": 0.0},
     "check 'values': square raised TypeError: unsupported operand"),
    ({"square": lambda x: _AlwaysEqual(), "offset": 0.0},
     "check 'values': square did not answer with data"),
])
def test_failures_say_why_for_people(check_file, namespace, message):
    result = checks.run_check(check_file, checks.LocalSubmission(namespace), seed=1)
    assert not result.passed and result.message.startswith(message), result.message


def test_an_empty_assertion_names_the_check_and_its_line(check_file):
    def square(x):  # right on five values, wrong on one
        return _square(x) if len(x) > 1 else np.zeros(1)

    result = checks.run_check(check_file, checks.LocalSubmission({"square": square,
                                                                  "offset": 0.0}), seed=1)
    assert result.message == ("check 'silent' failed at "
                              "`assert square(np.array([3.0]))[0] == 9.0`"), result.message


def test_the_grading_seed_draws_the_inputs(check_file):
    test = check_file.tests[0]
    first = checks.test_rng(1, "demo", test).normal(size=3)
    assert np.array_equal(first, checks.test_rng(1, "demo", test).normal(size=3))
    assert not np.array_equal(first, checks.test_rng(2, "demo", test).normal(size=3))


def test_a_check_file_needs_points_and_tests(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("points = 0\ndef test_x():\n    pass\n")
    with pytest.raises(ValueError, match="points must be a positive number"):
        checks.load_check(bad)
    bad.write_text("points = 1\n")
    with pytest.raises(ValueError, match="no test_\\* functions"):
        checks.load_check(bad)
