"""Host buffers aligned to a cache line, for CPU kernels.

Map:
  ALIGN                       64 bytes: a cache line (and an AVX-512 vector)
  aligned_empty(shape, dtype) an uninitialized C-contiguous array whose data starts on an ALIGN boundary
  aligned_empty_of(shape, dt, nbytes)   the same, shape / dtype / size already converted
  aligned_copy(a)             a C-contiguous copy of `a` on an ALIGN boundary
  data_address(a)             the address of an array's first byte, read from the array object itself (0.6 us
                              where `a.ctypes.data` takes 3-4 us: a compiled model's call reads one per argument)

Why: numpy's own arrays start wherever malloc puts them (16 bytes past a page for large ones, anywhere on a
16-byte boundary otherwise), and that changes from one allocation to the next.  A kernel whose vectors of 16
floats each fill one line when the buffer is aligned touches two lines per vector when it is not: the
column-strip weight-gradient dot of mlp_train_step (dot_general.9) ran 0.364 ms with its output aligned and
0.46-0.49 ms 16, 32 or 48 bytes off.  So the runner times every candidate on aligned buffers (the same
schedule no longer times differently from one candidate's allocation to the next) and compiled models hand
out aligned outputs (their intermediates already live in a 64-byte aligned arena).
"""

from __future__ import annotations

import ctypes
import math
import platform

import numpy as np

ALIGN = 64


def _data_field_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: numpy's array struct starts with the object header
    and then `data` (what its C API's PyArray_DATA reads).  Checked here on arrays and views at distinct
    addresses; None (use `a.ctypes.data`) if the layout is not what it should be."""
    if platform.python_implementation() != "CPython":   # id() is an object's address only in CPython
        return None
    off = object.__basicsize__
    base = np.arange(64, dtype=np.float32)
    try:
        return off if all(ctypes.c_void_p.from_address(id(a) + off).value == a.ctypes.data
                          for a in (base, base[3:], base[17:].reshape(1, 47), np.empty((5, 3), np.int8))) else None
    except (ValueError, OverflowError):
        return None


_DATA_OFFSET = _data_field_offset()
_from_address = ctypes.c_void_p.from_address


def data_address(a: np.ndarray) -> int:
    """The address of `a`'s first element (`a.ctypes.data`, five times faster)."""
    if _DATA_OFFSET is None or not isinstance(a, np.ndarray):
        return a.ctypes.data
    return _from_address(id(a) + _DATA_OFFSET).value or 0


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array of `shape` and `dtype` whose first byte is ALIGN-aligned."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    return aligned_empty_of(shape, dt, math.prod(shape) * dt.itemsize)


def aligned_empty_of(shape: tuple[int, ...], dt: np.dtype, nbytes: int) -> np.ndarray:
    """`aligned_empty` for a shape of ints, a dtype and their size in bytes already worked out (a compiled
    model's call: no conversions per output)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    return np.ndarray(shape, dt, raw, (-data_address(raw)) % ALIGN)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, ALIGN-aligned copy of `a` (same shape and dtype)."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a, casting="no")
    return out


__all__ = ["ALIGN", "aligned_empty", "aligned_copy", "data_address", "aligned_empty_of"]
