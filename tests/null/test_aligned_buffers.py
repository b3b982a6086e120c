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


def _ahead(out: int, other: int) -> int:
    """How far `out` starts after `other` modulo the aliasing span (0: the same page offset, counted as the most)."""
    return (out - other) % buffers.ALIAS_SPAN or buffers.ALIAS_SPAN


@pytest.mark.parametrize("n_others", [1, 2, 3, 5])
def test_aligned_empty_apart_places_the_array_behind_the_others(n_others):
    """Over random page offsets of the other buffers: the array is ALIGN-aligned, writable and of the right shape,
    and no ALIGN-aligned place (brute force over the span) would start it further from the nearest other it starts
    after; with one other it starts at that other's offset or less than ALIGN behind it."""
    rng = np.random.default_rng(n_others)
    span, align = buffers.ALIAS_SPAN, ALIGN
    for _ in range(40):
        others = [(1 << 20) + int(v) * 16 for v in rng.integers(0, span // 16, n_others)]
        a = buffers.aligned_empty_apart((7, 33), np.dtype(np.float32), 7 * 33 * 4, others)
        addr = data_address(a)
        assert addr % align == 0 and a.flags.c_contiguous and a.flags.writeable and a.shape == (7, 33)
        a[...] = 1.5
        assert float(a.sum()) == 1.5 * 7 * 33
        got = min(_ahead(addr, o) for o in others)
        best = max(min(_ahead(p, o) for o in others) for p in range(0, span, align))
        assert got == best, (others, addr % span)
        if n_others == 1:
            assert got > span - align


def test_compiled_model_output_not_just_after_its_input():
    """A compiled elementwise model's big output starts at its input's page offset or just before it, never just
    after it (the window where every store stalls the loads behind it), wherever the input starts; the results are
    numpy's."""
    import hlotune

    n = 1 << 17   # 512 KiB of float32: above APART_MIN_BYTES
    exe = hlotune.compile(f"HloModule m\n\nENTRY main {{\n  x = f32[{n}]{{0}} parameter(0)\n"
                          f"  c = f32[] constant(2)\n  b = f32[{n}]{{0}} broadcast(c), dimensions={{}}\n"
                          f"  ROOT y = f32[{n}]{{0}} multiply(x, b)\n}}\n")
    raw = aligned_empty((n + 1024,), np.float32)
    for shift in (0, 4, 12, 16, 100, 1000):   # floats past an aligned address
        x = raw[shift:shift + n]
        x[...] = np.arange(n, dtype=np.float32) - shift
        y = exe(x)
        y = y[0] if isinstance(y, tuple) else y
        ahead = (data_address(y) - data_address(x)) % buffers.ALIAS_SPAN
        assert ahead == 0 or ahead > buffers.ALIAS_SPAN - ALIGN, ahead   # at the input's offset or just before it
        np.testing.assert_array_equal(y, x * 2)


def test_runner_outputs_apart_from_inputs():
    """The runner's output buffers: poisoned like the reference, aligned, and the big ones at a big input's page
    offset or just before it, whatever offsets the inputs have."""
    from hlotune.measure.runner import _outputs_apart, poison

    n = 1 << 17
    raw = aligned_empty((n + 1024,), np.float32)
    for shift in (0, 4, 16, 20):
        x = raw[shift:shift + n]
        ref = np.arange(n, dtype=np.float32)
        (out, small) = _outputs_apart([ref, np.ones(8, np.float32)], [x])
        assert data_address(out) % ALIGN == 0 and data_address(small) % ALIGN == 0
        ahead = (data_address(out) - data_address(x)) % buffers.ALIAS_SPAN
        assert ahead == 0 or ahead > buffers.ALIAS_SPAN - ALIGN, ahead
        np.testing.assert_array_equal(out, poison(ref))
        np.testing.assert_array_equal(small, poison(np.ones(8, np.float32)))
