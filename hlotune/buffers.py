"""Host buffers aligned to a cache line, for CPU kernels.

Map:
  ALIGN                       64 bytes: a cache line (and an AVX-512 vector)
  aligned_empty(shape, dtype) an uninitialized C-contiguous array whose data starts on an ALIGN boundary
  aligned_empty_of(shape, dt, nbytes)   the same, shape / dtype / size already converted
  aligned_empty_apart(shape, dt, nbytes, others)   the same, placed off the others' page offsets (4K aliasing)
  empty_outputs(specs, inputs)   output buffers of (shape, dt, nbytes), the big ones placed apart from the big
                              inputs and from each other (a compiled model's call, the measurement runner)
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


#: a load whose address equals an older, still pending store's in its low 12 bits waits for that store (the core
#: compares only those bits first: "4K aliasing").  A kernel streaming an input into an output that starts a little
#: after the input's page offset hits that on every vector: gelu_tanh's elementwise kernel (32 MB in, 32 MB out) ran
#: 20.0-20.2 ms with the output's page offset 0 or 128-4080 bytes past the input's and 27.5-29.8 ms 16-96 bytes past
#: it (AMD Zen 1, docs/benchmarks.md, session 51), and glibc puts every large array 16 bytes past a page, so an
#: ALIGN-aligned output was 48 bytes past its input every time.
ALIAS_SPAN = 4096
#: outputs of at least this many bytes are placed by `aligned_empty_apart`
APART_MIN_BYTES = 1 << 18


def aligned_empty_apart(shape: tuple[int, ...], dt: np.dtype, nbytes: int, others: list[int]) -> np.ndarray:
    """`aligned_empty_of`, with the array's first byte placed modulo ALIAS_SPAN at the same offset as one of the
    buffers at addresses `others` or just before it (one ALIGN), whichever leaves the least of them with the array
    starting a little after it (the aliasing window): the array's stores then trail every stream read at the same
    index instead of running just ahead of one."""
    raw = np.empty(nbytes + ALIGN + ALIAS_SPAN, dtype=np.uint8)
    addr = data_address(raw)
    base = addr + (-addr) % ALIGN
    if not others:
        return np.ndarray(shape, dt, raw, base - addr)
    cands = {0}
    for o in others:
        same = (o - base) % ALIAS_SPAN // ALIGN * ALIGN
        cands.update((same, (same - ALIGN) % ALIAS_SPAN))
    off = max(sorted(cands), key=lambda c: min((base + c - o) % ALIAS_SPAN or ALIAS_SPAN for o in others))
    return np.ndarray(shape, dt, raw, base - addr + off)


def empty_outputs(specs: list[tuple[tuple[int, ...], np.dtype, int]], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Aligned buffers for `specs` (shape, dtype, bytes); each of at least APART_MIN_BYTES placed by
    `aligned_empty_apart` off the big `inputs` and the big buffers before it."""
    others = [data_address(a) for a in inputs if a.nbytes >= APART_MIN_BYTES]
    out = []
    for shape, dt, nbytes in specs:
        if nbytes >= APART_MIN_BYTES:
            out.append(aligned_empty_apart(shape, dt, nbytes, others))
            others.append(data_address(out[-1]))
        else:
            out.append(aligned_empty_of(shape, dt, nbytes))
    return out


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, ALIGN-aligned copy of `a` (same shape and dtype)."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a, casting="no")
    return out


__all__ = ["ALIGN", "aligned_empty", "aligned_copy", "data_address", "aligned_empty_of", "aligned_empty_apart",
           "empty_outputs", "ALIAS_SPAN", "APART_MIN_BYTES"]
