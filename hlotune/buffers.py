"""Host buffers aligned to a cache line, for CPU kernels.

Map:
  ALIGN                       64 bytes: a cache line (and an AVX-512 vector)
  aligned_empty(shape, dtype) an uninitialized C-contiguous array whose data starts on an ALIGN boundary
  aligned_copy(a)             a C-contiguous copy of `a` on an ALIGN boundary

Why: numpy's own arrays start wherever malloc puts them (16 bytes past a page for large ones, anywhere on a
16-byte boundary otherwise), and that changes from one allocation to the next.  A kernel whose vectors of 16
floats each fill one line when the buffer is aligned touches two lines per vector when it is not: the
column-strip weight-gradient dot of mlp_train_step (dot_general.9) ran 0.364 ms with its output aligned and
0.46-0.49 ms 16, 32 or 48 bytes off.  So the runner times every candidate on aligned buffers (the same
schedule no longer times differently from one candidate's allocation to the next) and compiled models hand
out aligned outputs (their intermediates already live in a 64-byte aligned arena).
"""

from __future__ import annotations

import numpy as np

ALIGN = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array of `shape` and `dtype` whose first byte is ALIGN-aligned."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + n].view(dt).reshape(shape)


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, ALIGN-aligned copy of `a` (same shape and dtype)."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a, casting="no")
    return out


__all__ = ["ALIGN", "aligned_empty", "aligned_copy"]
