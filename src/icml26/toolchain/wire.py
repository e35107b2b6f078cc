"""What crosses between the grader and a submission's kernel: requests in, data out.

The grader asks a submission's kernel for values: *call this function of the submission on these
inputs*, *what is this name*, *evaluate this expression*. A request is built by the grader and may
carry any Python object it made (cloudpickle, decoded inside the kernel, which runs the
submission's code anyway). An answer comes back as **data only**: JSON text in which arrays and
tensors travel as ``.npy`` bytes (base64), fractions, tuples and dicts as tagged JSON. The grader
decodes it with :func:`decode`, which accepts nothing else: never pickle, never an object with
methods of its own, no array of Python objects, nothing over :data:`MAX_ANSWER_BYTES`. Whatever
a submission does to its kernel can therefore change only its own answers, never how they are
compared.

:func:`serve` is the kernel side (the grader sends ``serve(nonce, request)`` as a cell); it
displays one answer under :data:`ANSWER_MIME`, tagged with the request's nonce.
"""

from __future__ import annotations

import ast
import base64
import importlib
import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction

import cloudpickle
import numpy as np

ANSWER_MIME = "application/vnd.icml26.answer+json"
MAX_ANSWER_BYTES = 64 * 2**20
_ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: numbers only
_TAGS = ("tuple", "dict", "ndarray", "tensor", "fraction", "float")


class DataError(ValueError):
    """An answer that is not data, or data that is not well formed."""


# --- Encoding (kernel side) and decoding (grader side) ---------------------------------------


def _npy(array: np.ndarray) -> str:
    if array.dtype.kind not in _ARRAY_KINDS:
        raise DataError(f"an array of dtype {array.dtype} is not data (numbers only)")
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _plain(value: object) -> object:
    """``value`` as JSON-ready data, or a :class:`DataError` naming what is not data."""
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value
    if kind is float:
        return value if np.isfinite(value) else {"float": repr(value)}
    if kind in (list, tuple):
        items = [_plain(item) for item in value]
        return items if kind is list else {"tuple": items}
    if kind is dict:
        return {"dict": [[_plain(k), _plain(v)] for k, v in value.items()]}
    if kind is Fraction:
        return {"fraction": [value.numerator, value.denominator]}
    if isinstance(value, np.generic) and kind.__module__ == "numpy":
        return _plain(value.item())
    if kind is np.ndarray:
        return {"ndarray": _npy(value)}
    torch = sys.modules.get("torch")
    if torch is not None and kind in (torch.Tensor, torch.nn.Parameter):
        return {"tensor": _npy(value.detach().cpu().resolve_conj().numpy())}
    raise DataError(f"a {kind.__module__}.{kind.__qualname__} is not data (return numbers, "
                    "strings, lists, tuples, dicts, fractions, arrays or tensors)")


def encode(value: object) -> str:
    """``value`` as answer text (kernel side); :class:`DataError` if it is not data."""
    text = json.dumps({"ok": _plain(value)}, allow_nan=False)
    if len(text) > MAX_ANSWER_BYTES:
        raise DataError(f"the answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB")
    return text


def _array(text: object) -> np.ndarray:
    if not isinstance(text, str):
        raise DataError("an array must travel as base64 text")
    array = np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)
    if array.dtype.kind not in _ARRAY_KINDS:
        raise DataError(f"an array of dtype {array.dtype} is not data")
    return array


def _value(item: object) -> object:
    if item is None or type(item) in (bool, int, float, str):
        return item
    if type(item) is list:
        return [_value(x) for x in item]
    if type(item) is not dict or len(item) != 1 or next(iter(item)) not in _TAGS:
        raise DataError(f"not a tagged value: {str(item)[:80]}")
    (tag, body), = item.items()
    if tag == "tuple":
        if type(body) is not list:
            raise DataError("a tuple must travel as a list")
        return tuple(_value(x) for x in body)
    if tag == "dict":
        if type(body) is not list or not all(type(p) is list and len(p) == 2 for p in body):
            raise DataError("a dict must travel as a list of pairs")
        return {_hashable(_value(k)): _value(v) for k, v in body}
    if tag == "fraction":
        if type(body) is not list or len(body) != 2 or not all(type(x) is int for x in body) \
                or body[1] == 0:
            raise DataError("a fraction must travel as two integers")
        return Fraction(*body)
    if tag == "float":
        if body not in ("nan", "inf", "-inf"):
            raise DataError(f"not a float: {body!r}")
        return float(body)
    array = _array(body)
    if tag == "tensor":
        import torch

        return torch.from_numpy(array.copy())
    return array


def _hashable(key: object) -> object:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, (np.ndarray, dict)) or type(key).__module__ == "torch":
        raise DataError("a dict key must be a number, a string or a tuple of them")
    return key


def decode(text: str) -> dict:
    """An answer's text as ``{"ok": value}`` or ``{"error": [name, message]}`` (grader side).

    Values are ``None``, bools, ints, floats, strings, lists, tuples, dicts, fractions, NumPy
    arrays of numbers and torch tensors; anything else raises :class:`DataError`.
    """
    if not isinstance(text, str):
        raise DataError("an answer must be JSON text")
    if len(text) > MAX_ANSWER_BYTES:
        raise DataError(f"the answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise DataError(f"the answer is not JSON: {error}") from None
    if type(message) is not dict or len(message) != 1:
        raise DataError("an answer is one of {'ok': value} or {'error': [name, message]}")
    if "error" in message:
        error = message["error"]
        if type(error) is not list or len(error) != 2 or not all(type(e) is str for e in error):
            raise DataError("an error must travel as [name, message]")
        return {"error": [error[0][:100], error[1][:2000]]}
    if "ok" not in message:
        raise DataError("an answer is one of {'ok': value} or {'error': [name, message]}")
    try:
        return {"ok": _value(message["ok"])}
    except RecursionError:
        raise DataError("the answer is nested too deeply") from None
    except (ValueError, TypeError, EOFError) as error:
        raise DataError(f"the answer is not data: {error}") from None


# --- Requests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One question to a submission: ``kind`` is "describe" (``names``), "call" (``name`` on
    ``args``/``kwargs``) or "evaluate" (``source`` with ``kwargs`` bound); library functions
    named in ``forbid`` raise while it runs; ``about`` names it in messages."""

    kind: str
    name: str = ""
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    names: tuple[str, ...] = ()
    source: str = ""
    forbid: tuple[str, ...] = ()
    about: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("describe", "call", "evaluate"):
            raise ValueError(f"unknown request kind {self.kind!r}")

    @property
    def subject(self) -> str:
        """What a message about the answer calls it."""
        if self.about:
            return self.about
        return {"call": self.name, "describe": "the submission"}.get(self.kind,
                                                                      "the check's expression")

    def pack(self) -> str:
        """The request as base64 text, ready to paste into a cell."""
        return base64.b64encode(cloudpickle.dumps(self)).decode("ascii")


def unpack(text: str) -> Request:
    return cloudpickle.loads(base64.b64decode(text))


_answering: list[dict] = []  # the namespace answering the request under way (innermost last)


class NamespaceFunction:
    """A function of the submission, named by the grader: it travels by name and is looked up
    in the namespace that answers, so a check can hand the submission one of its own functions."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self):
        return (NamespaceFunction, (self.name,))

    def __call__(self, *args, **kwargs):
        if not _answering:
            raise RuntimeError(f"{self.name} can only be called while answering a request")
        return _answering[-1][self.name](*args, **kwargs)


def _resolve(target: str):
    """The object named by a dotted path: the longest importable module, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ValueError(f"cannot resolve {target!r}")


@contextmanager
def forbidden(targets: tuple[str, ...], reason: str) -> Iterator[None]:
    """While inside, each library function in ``targets`` (dotted names) raises instead of
    running, even through a reference taken earlier (its code object is swapped)."""
    saved = []
    try:
        for target in targets:
            function = _resolve(target)
            function = getattr(function, "__func__", function)
            message = f"{reason}: calling {target} is not allowed here"
            scope: dict = {}
            exec(f"def tripwire(*args, **kwargs):\n    raise RuntimeError({message!r})", scope)
            saved.append((function, function.__code__))
            function.__code__ = scope["tripwire"].__code__
        yield
    finally:
        for function, code in saved:
            function.__code__ = code


def answer(request: Request, namespace: dict) -> str:
    """The answer text to ``request`` from ``namespace`` (the submission's globals)."""
    _answering.append(namespace)
    try:
        with forbidden(request.forbid, "this exercise asks for your own implementation"):
            value = _ask(request, namespace)
        return encode(value)
    except DataError as error:
        return json.dumps({"error": ["DataError", str(error)]})
    except Exception as error:  # the submission's own failure, reported as data
        try:
            text = str(error)
        except Exception:  # an exception whose message itself fails
            text = ""
        return json.dumps({"error": [type(error).__name__, text]})
    finally:
        _answering.pop()


def _ask(request: Request, namespace: dict) -> object:
    if request.kind == "describe":
        described = {}
        for name in request.names:
            if name not in namespace:
                described[name] = "missing"
            elif callable(namespace[name]):
                described[name] = "callable"
            else:
                _plain(namespace[name])  # fails here, naming the value that is not data
                described[name] = ["value", namespace[name]]
        return described
    if request.kind == "call":
        return namespace[request.name](*request.args, **request.kwargs)
    scope = {**namespace, **request.kwargs}
    tree = ast.parse(request.source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<check>", "exec"), scope)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<check>", "eval"), scope)


def serve(nonce: str, packed: str) -> None:
    """Answer one request inside the kernel: display the answer under :data:`ANSWER_MIME`."""
    from IPython.display import display

    import __main__

    display({ANSWER_MIME: {"nonce": nonce, "answer": answer(unpack(packed), vars(__main__))}},
            raw=True)
