"""Cache-line aligned host buffers (hlotune.buffers) and their use by the runner: every buffer a candidate is
timed on starts on a 64-byte boundary, so one schedule times the same whatever malloc returned."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hlotune import buffers
from hlotune.buffers import ALIGN, aligned_copy, aligned_empty, aligned_empty_of, data_address
from hlotune.measure.records import ErrorKind
from hlotune.measure.reference import TaskData
from hlotune.measure.runner import TimingConfig, measure_kernel


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5), (7, 1, 9), (1000,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.bool_, np.int64])
def test_aligned_empty_and_copy(shape, dtype):
    dt = np.dtype(dtype)
    for _ in range(4):   # several allocations: malloc's own offset changes between them
        for a in (aligned_empty(shape, dtype), aligned_empty_of(shape, dt, int(np.prod(shape)) * dt.itemsize)):
            assert a.shape == shape and a.dtype == dt and a.flags.c_contiguous and a.flags.writeable
            assert a.ctypes.data % ALIGN == 0 or a.size == 0   # an empty array has no data to align
            a[...] = 1   # the whole buffer is writable memory of its own
            assert (a == 1).all()
    src = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
    c = aligned_copy(src[...])
    assert (c.ctypes.data % ALIGN == 0 or c.size == 0) and c.flags.c_contiguous
    np.testing.assert_array_equal(c, src)
    if src.ndim == 2:   # a transposed (non-contiguous) view
        t = aligned_copy(src.T)
        assert t.flags.c_contiguous and t.ctypes.data % ALIGN == 0
        np.testing.assert_array_equal(t, src.T)


class _Sub(np.ndarray):
    pass


def test_data_address_is_ctypes_data():
    """The fast address read (a compiled model's call reads one per argument and output) gives what numpy's
    `ctypes.data` gives, for every kind of array a caller may hand in: views at offsets, strided and
    transposed views, reshaped views, 0-d and empty arrays, read-only arrays, subclasses, memory of another
    owner (a bytearray), and an array made from a list."""
    base = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    ro = base.copy()
    ro.flags.writeable = False
    cases = [base, base[1:], base[:, 2:, 1:], base[::2, ::3], base.T, base.reshape(-1)[7:], base[2:3, 3, 4].reshape(()),
             np.full((), 3.0), np.empty((0, 3), np.int8), ro, base.view(_Sub)[1:],
             np.frombuffer(bytearray(64), np.uint8)[5:], np.asarray([1, 2, 3], np.int16)]
    assert buffers._DATA_OFFSET == object.__basicsize__   # CPython: the fast read is the one in use
    for a in cases:
        assert data_address(a) == a.ctypes.data, (a.shape, a.strides)
    for _ in range(3):   # arrays come and go: the address is read from each one
        a = np.empty(1000 + _, np.float32)
        assert data_address(a) == a.ctypes.data


def test_data_address_without_the_fast_read(monkeypatch):
    """Where the layout check fails (another Python, another numpy), `ctypes.data` answers."""
    monkeypatch.setattr(buffers, "_DATA_OFFSET", None)
    a = np.arange(10, dtype=np.float32)[3:]
    assert data_address(a) == a.ctypes.data


def test_runner_times_on_aligned_buffers():
    """measure_kernel hands the kernel aligned copies of the inputs and aligned outputs, for inputs at any
    offset (numpy views 4 bytes past a line)."""
    seen = []
    raw = np.arange(1 + 4 * 33, dtype=np.float32)
    x = raw[1:].reshape(4, 33)                       # 4 bytes past malloc's boundary
    expected = (x * 2).astype(np.float32)

    def bind(*bufs):
        seen.append([b.ctypes.data % ALIGN for b in bufs])

        def run():
            np.multiply(bufs[0], 2, out=bufs[1])
        return run

    func = SimpleNamespace(inputs=[SimpleNamespace(name="x")],
                           outputs=[SimpleNamespace(name="y", shape=(4, 33), dtype=SimpleNamespace(np=np.float32))])
    kernel = SimpleNamespace(func=func, bind=bind)
    data = TaskData("k", (x,), (expected,), ((0.0, 0.0),))
    kind, msg, costs = measure_kernel(kernel, data, TimingConfig(warmup_ms=0.0, repeats=2, min_repeat_ms=0.0))
    assert kind is ErrorKind.NONE, msg
    assert len(costs) == 2
    assert seen == [[0, 0]]
