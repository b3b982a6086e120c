"""Shared pieces of the CPU benchmark suite (numpy + standard library only: also imported by
`jax_side.py` inside the side venv `.venv-bench`, which has no hlotune).

Map:
  REPO, MANIFEST, load_manifest()          the fixture models and their bench sizes
  bench_inputs(name, entry)                 deterministic random inputs at bench size
  Timer / time_calls(fn, rule)              warm-up, then repeats until a count and a duration; median, spread
  shape_tag(shape)                          a dense-layer shape of awkward_gemm.py as a file name stem
  compare(outs, refs)                       max abs error and the pass/fail rule against a reference
  warm_malloc()                             glibc: keep freed big buffers (same setting on every side)
  replace_section(text, body, start, end)   rewrite only the marked part of a markdown file
  blas_info() / measure_peaks()             `python benchmarks/common.py peaks`: numpy matmul and copy peaks
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "tests" / "data" / "models" / "manifest.json"
MODELS_DIR = MANIFEST.parent

START = "<!-- bench:cpu-default:start -->"
END = "<!-- bench:cpu-default:end -->"

#: correctness rule: |out - ref| <= RTOL*|ref| + ATOL*max(1, max|ref|) elementwise (atol scaled by the
#: output's magnitude so that big reductions, whose float32 rounding grows with their size, are judged fairly)
RTOL = 1e-4
ATOL = 1e-4

#: glibc settings that keep freed big buffers for reuse (no fresh mmap + page faults per call); the same
#: values jax_cpu_times.json used for its steady-state figures.  Applied to every side of the benchmark.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 31 - 1)}


def load_manifest() -> dict:
    with open(MANIFEST, encoding="utf-8") as fh:
        return json.load(fh)


def bench_hlo_path(name: str, entry: dict) -> Path:
    return MODELS_DIR / entry["files"]["bench_hlo"]


def bench_inputs(name: str, entry: dict) -> list[np.ndarray]:
    """Standard-normal float32 inputs of the bench shapes, seeded by the model name."""
    rng = np.random.default_rng(zlib.crc32(f"{name}/bench".encode()))
    out = []
    for spec in entry["bench"]["inputs"]:
        if spec["dtype"] != "float32":
            raise ValueError(f"{name}: input {spec['name']} has dtype {spec['dtype']}, only float32 is generated")
        out.append(rng.standard_normal(tuple(spec["shape"]), dtype=np.float32))
    return out


# ---- timing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimingRule:
    """Warm-up calls, then repeat until at least `min_repeats` calls AND `min_seconds`; stop early
    (with at least 3 calls) once `max_seconds` have passed."""

    warmup: int = 3
    min_repeats: int = 20
    min_seconds: float = 1.0
    max_seconds: float = 20.0


FULL = TimingRule()
QUICK = TimingRule(warmup=1, min_repeats=5, min_seconds=0.2, max_seconds=3.0)


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    p10_s: float
    p90_s: float
    n: int

    @property
    def spread(self) -> float:
        """Half the p10..p90 range relative to the median (0.05 = +-5%)."""
        return (self.p90_s - self.p10_s) / 2 / self.median_s if self.median_s > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "spread": self.spread}


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def time_calls(fn: Callable[[], object], rule: TimingRule = FULL) -> Timing:
    """Time `fn()` (which must return only when its work is done) by `rule`."""
    t_warm = time.perf_counter()
    for _ in range(rule.warmup):
        fn()
        if time.perf_counter() - t_warm > rule.max_seconds / 4:   # slow code: fewer warm-up calls
            break
    times: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        if len(times) >= rule.min_repeats and elapsed >= rule.min_seconds:
            break
        if elapsed >= rule.max_seconds and len(times) >= 3:
            break
    return Timing(statistics.median(times), min(times), max(times), _quantile(times, 0.1), _quantile(times, 0.9),
                  len(times))


# ---- correctness ---------------------------------------------------------------------------------

def shape_tag(shape: str) -> str:
    """A dense-layer shape of `awkward_gemm.py` ('[B/]M,K,N[,t]') as a file name stem (its JAX side reads the same)."""
    return shape.replace(",", "_").replace("/", "b")


def compare(outs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> dict:
    """Max abs error, max error relative to max|ref| (per output, worst taken) and pass/fail by RTOL/ATOL."""
    if len(outs) != len(refs):
        return {"ok": False, "max_abs_err": float("nan"), "max_rel_err": float("nan"),
                "why": f"{len(outs)} output(s), reference has {len(refs)}"}
    worst_abs = worst_rel = 0.0
    ok, why = True, ""
    for i, (o, r) in enumerate(zip(outs, refs)):
        o = np.asarray(o, dtype=np.float64)
        r = np.asarray(r, dtype=np.float64)
        if o.shape != r.shape:
            return {"ok": False, "max_abs_err": float("nan"), "max_rel_err": float("nan"),
                    "why": f"out{i}: shape {list(o.shape)}, reference {list(r.shape)}"}
        scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
        diff = np.abs(o - r)
        bad = ~(diff <= RTOL * np.abs(r) + ATOL * scale)   # NaN counts as bad
        d = float(np.max(diff)) if diff.size else 0.0
        if np.isnan(d):
            d = float("inf")
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / scale)
        if bad.any() and ok:
            ok, why = False, f"out{i}: {int(bad.sum())} of {bad.size} element(s) outside tolerance"
    return {"ok": ok, "max_abs_err": worst_abs, "max_rel_err": worst_rel, "why": why}


# ---- machine -------------------------------------------------------------------------------------

def warm_malloc() -> bool:
    """Set MALLOC_ENV's values in this process through mallopt (glibc); False where not possible."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        a = libc.mallopt(m_mmap_threshold, int(MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]))
        b = libc.mallopt(m_trim_threshold, int(MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]))
        return bool(a and b)
    except (OSError, AttributeError):
        return False


def blas_info() -> dict:
    """The BLAS numpy uses and the kernel it picked (threadpoolctl when installed, else OpenBLAS by ctypes)."""
    np.ones((8, 8), np.float32) @ np.ones((8, 8), np.float32)   # make sure the library is loaded
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            i = infos[0]
            return {"via": "threadpoolctl", "api": i.get("internal_api"), "version": i.get("version"),
                    "kernel": i.get("architecture"), "threads": i.get("num_threads"), "lib": i.get("filepath")}
    except ImportError:
        pass
    return _openblas_by_ctypes()


def _openblas_by_ctypes() -> dict:
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            libs = sorted({ln.split()[-1] for ln in fh if "openblas" in ln.lower() and "/" in ln})
    except OSError:
        libs = []
    for path in libs:
        lib = ctypes.CDLL(path)
        for pre, suf in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            try:
                core = getattr(lib, f"{pre}openblas_get_corename{suf}")
                conf = getattr(lib, f"{pre}openblas_get_config{suf}")
                nthr = getattr(lib, f"{pre}openblas_get_num_threads{suf}")
            except AttributeError:
                continue
            core.restype = conf.restype = ctypes.c_char_p
            return {"via": "ctypes", "api": "openblas", "version": conf().decode(), "kernel": core().decode(),
                    "threads": int(nthr()), "lib": path}
    return {"via": "none", "api": "unknown"}


def _copy_rate(src: np.ndarray, dst: np.ndarray, threads: int, rule: TimingRule) -> float:
    """GB/s of np.copyto over `threads` threads (each a contiguous slice), counting read + write bytes."""
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def one(lo: int, hi: int) -> None:
        np.copyto(dst[lo:hi], src[lo:hi])

    def run() -> None:
        if threads == 1:
            np.copyto(dst, src)
            return
        ts = [threading.Thread(target=one, args=b) for b in bounds]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    t = time_calls(run, rule)
    return 2 * src.nbytes / t.median_s / 1e9


def measure_peaks(quick: bool = False) -> dict:
    """numpy float32 matmul GFLOP/s (1024^3, 2048^3) and np.copyto GB/s of a 256 MB array (1 thread and
    one thread per core); medians."""
    rule = QUICK if quick else TimingRule(warmup=2, min_repeats=10, min_seconds=1.0, max_seconds=10.0)
    rng = np.random.default_rng(0)
    out: dict = {"numpy": np.__version__, "blas": blas_info(), "matmul_gflops": {}, "copy_gbs": {}}
    for n in (1024, 2048):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), np.float32)
        t = time_calls(lambda a=a, b=b, c=c: np.matmul(a, b, out=c), rule)
        out["matmul_gflops"][str(n)] = 2.0 * n ** 3 / t.median_s / 1e9
    src = np.ones(256 * 2 ** 20 // 4, np.float32)
    dst = np.zeros_like(src)
    cores = os.cpu_count() or 1
    out["copy_gbs"]["1"] = _copy_rate(src, dst, 1, rule)
    if cores > 1:
        out["copy_gbs"][str(cores)] = _copy_rate(src, dst, cores, rule)
    out["peak_gflops"] = max(out["matmul_gflops"].values())
    out["peak_gbs"] = max(out["copy_gbs"].values())
    return out


# ---- markdown ------------------------------------------------------------------------------------

def replace_section(text: str, body: str, start: str = START, end: str = END) -> str:
    """`text` with everything between the `start`/`end` markers replaced by `body` (markers kept);
    the markers and body are appended when absent.  Text outside the markers is kept byte for byte."""
    block = f"{start}\n{body.rstrip()}\n{end}"
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}{block}\n"
    return text[:i] + block + text[j + len(end):]


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 1 and argv[0] == "peaks":
        json.dump(measure_peaks(quick="--quick" in argv), sys.stdout)
        print()
        return 0
    print("usage: python benchmarks/common.py peaks [--quick]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
