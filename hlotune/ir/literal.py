"""Constant literals: HLO text <-> numpy arrays.

Map:
  parse_literal(text, shape)   `1`, `{1, 2}`, `{ {1, 2}, {3, 4} }`, inf/-inf/nan, true/false -> ndarray
  format_literal(arr, dtype)   ndarray -> canonical text (exact round trip)

Canonical text: scalars print bare; arrays print nested braces, `{ {1, 2}, {3, 4} }` (inner
levels padded with a space like XLA does, the innermost not).  Floats print the shortest
decimal that reads back to the same value of their type (bf16 values are held as float32);
integers print in decimal; pred prints true/false.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import ParseError, ShapeError, UnsupportedError
from .hlo import ArrayShape, DType

_TOKEN = re.compile(r"[^\s{},()]+")
_BAD = re.compile(r"[^\s{},0-9a-zA-Z.+\-]")
_FLOAT_WORDS = {"inf": np.inf, "+inf": np.inf, "-inf": -np.inf, "nan": np.nan, "-nan": np.nan, "+nan": np.nan}


def parse_literal(text: str, shape: ArrayShape) -> np.ndarray:
    """The array a constant's literal text denotes, as `shape.dtype.np` with `shape.dims`.

    Raises ParseError on a malformed element, ShapeError on the wrong number of elements.
    """
    if not isinstance(shape, ArrayShape):
        raise UnsupportedError(f"tuple-shaped constant {text[:40]!r} is not supported")
    if "..." in text:
        raise UnsupportedError("elided constant '{...}' (print with print_large_constants=True)")
    bad = _BAD.search(text)
    if bad:
        raise ParseError(f"unexpected character {bad.group()!r} in literal {text[:40]!r}")
    if text.count("{") != text.count("}"):
        raise ParseError(f"unbalanced braces in literal {text[:40]!r}")
    tokens = _TOKEN.findall(text)
    if len(tokens) != shape.size:
        raise ShapeError(f"literal has {len(tokens)} elements but shape {shape} holds {shape.size}")
    values = _convert(tokens, shape.dtype)
    return values.reshape(shape.dims)


def _convert(tokens: list[str], dtype: DType) -> np.ndarray:
    if dtype is DType.PRED:
        return np.array([_pred(t) for t in tokens], dtype=bool)
    if dtype.is_float:
        return np.array([_float(t) for t in tokens], dtype=np.float64).astype(dtype.np)
    ints = [_int(t) for t in tokens]
    info = np.iinfo(dtype.np)
    for v in ints:
        if v < info.min or v > info.max:
            raise ParseError(f"integer {v} out of range for {dtype}")
    return np.array(ints, dtype=dtype.np)


def _pred(t: str) -> bool:
    if t in ("true", "1"):
        return True
    if t in ("false", "0"):
        return False
    raise ParseError(f"bad pred literal element {t!r}")


def _float(t: str) -> float:
    w = _FLOAT_WORDS.get(t.lower())
    if w is not None:
        return w
    try:
        return float(t)
    except ValueError:
        raise ParseError(f"bad floating-point literal element {t!r}") from None


def _int(t: str) -> int:
    try:
        return int(t, 10)
    except ValueError:
        pass
    if t in ("true", "false"):
        return int(t == "true")
    raise ParseError(f"bad integer literal element {t!r}")


def format_literal(arr: np.ndarray, dtype: DType) -> str:
    """Canonical text of `arr` as a literal of element type `dtype` (parse_literal reads it back exactly)."""
    arr = np.asarray(arr)
    if dtype is DType.BF16:
        arr = arr.astype(np.float32)
    else:
        arr = arr.astype(dtype.np)
    fmt = _formatter(dtype)
    flat = [fmt(x) for x in arr.reshape(-1)]
    if arr.ndim == 0:
        return flat[0]
    return _nest(flat, arr.shape)


def _formatter(dtype: DType):
    if dtype is DType.PRED:
        return lambda x: "true" if x else "false"
    if dtype.is_float:
        return _format_float
    return lambda x: str(int(x))


def _format_float(x) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "-0" if np.signbit(x) else "0"
    ax = abs(float(x))
    if 1e-4 <= ax < 1e16:
        return np.format_float_positional(x, unique=True, trim="-")
    return np.format_float_scientific(x, unique=True, trim="-")


def _nest(flat: list[str], dims: tuple[int, ...]) -> str:
    if len(dims) == 1:
        return "{" + ", ".join(flat) + "}"
    inner = 1
    for d in dims[1:]:
        inner *= d
    parts = [_nest(flat[k * inner:(k + 1) * inner], dims[1:]) for k in range(dims[0])]
    return "{ " + ", ".join(parts) + " }"
