"""hlotune (default schedules) and numpy on one fixture model at bench size; one process per model.

    .venv/bin/python benchmarks/bench_models.py NAME --side hlotune --inputs IN.npz --outputs OUT.npz [--quick]
    .venv/bin/python benchmarks/bench_models.py NAME --side numpy --inputs IN.npz [--outputs NP.npz]
        [--reference REF.npz] [--quick]

The two sides run in separate processes so that a crash in generated code loses only hlotune's row.
Steps, each written to stdout as one JSON line as soon as it is done (so a crash or timeout in a
later step keeps the earlier ones): hlotune side: `start`, `compile` (wall time of
`hlotune.compile(NAME.bench.hlo)` and `exe.compile_s`), `hlotune` (timing of `exe(*inputs)`, outputs
saved to OUT.npz); numpy side: `numpy` (timing of the version in NUMPY_IMPLS, when there is one),
`reference` (only with --reference: the reference interpreter's outputs, used when JAX is not there).

Map: NUMPY_IMPLS (name -> function of the inputs);  compile_model / run_steps / main
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np
from common import FULL, QUICK, bench_hlo_path, load_manifest, time_calls, warm_malloc

# ---- numpy versions of the models that have a natural one --------------------------------------

def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    s = x - x.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def _layernorm(x, scale, bias, eps=np.float32(1e-5)):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _gelu_tanh(x):
    c = np.float32(math.sqrt(2 / math.pi))
    return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _mlp2(x, w1, b1, w2, b2):
    return _log_softmax(np.maximum(x @ w1 + b1, 0) @ w2 + b2)


def _transformer_block(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = (q @ np.swapaxes(k, -1, -2)) / np.float32(math.sqrt(x.shape[-1]))
    return (_softmax(scores) @ v) @ wo + x


def _rmsnorm_swiglu(x, g, w1, w3, w2, eps=np.float32(1e-6)):
    h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g
    a = h @ w1
    return (a / (np.float32(1) + np.exp(-a)) * (h @ w3)) @ w2


NUMPY_IMPLS: dict[str, Callable[..., np.ndarray]] = {
    "sin_mul_add": lambda x: np.sin(x) * np.float32(2) + np.float32(1),
    "relu_chain": lambda x: np.maximum(x * np.float32(2) + np.float32(1), 0) * np.float32(0.5),
    "sum_reduce": lambda x: x.sum(),
    "row_sum": lambda x: x.sum(axis=1),
    "softmax": _softmax,
    "layernorm": _layernorm,
    "gelu_tanh": _gelu_tanh,
    "matmul": lambda a, b: a @ b,
    "dense_bias_relu": lambda x, w, b: np.maximum(x @ w + b, 0),
    "batch_matmul": lambda a, b: a @ b,
    "mlp2": _mlp2,
    "transformer_block": _transformer_block,
    "rmsnorm_swiglu": _rmsnorm_swiglu,
}


# ---- steps ---------------------------------------------------------------------------------------

def _emit(step: str, **fields) -> None:
    print(json.dumps({"step": step, **fields}), flush=True)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:300]


def _warm_llvm() -> float:
    """Compile a tiny model once so that per-process LLVM start-up is not charged to the model."""
    import hlotune

    tiny = ("HloModule warm\n\nENTRY main {\n  p = f32[8]{0} parameter(0)\n  ROOT a = f32[8]{0} add(p, p)\n}\n")
    t0 = time.perf_counter()
    try:
        hlotune.compile(tiny)(np.ones(8, np.float32))
    except Exception:   # noqa: BLE001 - only a warm-up; the model's own compile reports errors
        pass
    return time.perf_counter() - t0


def compile_model(name: str, entry: dict, tuning_log: str | None = None):
    """(executable, wall seconds) of hlotune.compile on the bench-size HLO (with the best schedules of
    `tuning_log` when given).  The in-memory kernel cache holds only the warm-up model here (each model runs in
    a fresh process), so this is a cold compile."""
    import hlotune

    t0 = time.perf_counter()
    exe = hlotune.compile(str(bench_hlo_path(name, entry)), tuning_log=tuning_log)
    return exe, time.perf_counter() - t0


def _hlotune_steps(a: argparse.Namespace, entry: dict, args: list[np.ndarray]) -> None:
    rule = QUICK if a.quick else FULL
    _emit("start", warm_malloc=warm_malloc(), llvm_warmup_s=_warm_llvm())
    try:
        exe, wall = compile_model(a.model, entry, a.tuning_log)
        _emit("compile", ok=True, wall_s=wall, compile_s=getattr(exe, "compile_s", None),
              sources=sorted(set(exe.sources().values())) if hasattr(exe, "sources") else None)
    except Exception as e:  # noqa: BLE001 - reported as the model's row
        _emit("compile", ok=False, error=_one_line(e), trace=traceback.format_exc(limit=-3))
        return
    try:
        outs = exe(*args)
        np.savez(a.outputs, **{f"out{i}": np.asarray(x) for i, x in enumerate(outs)})
        t = time_calls(lambda: exe(*args), rule)
        _emit("hlotune", ok=True, timing=t.to_json())
    except Exception as e:  # noqa: BLE001
        _emit("hlotune", ok=False, error=_one_line(e), trace=traceback.format_exc(limit=-3))


def _baseline_steps(a: argparse.Namespace, entry: dict, args: list[np.ndarray]) -> None:
    warm_malloc()
    impl = NUMPY_IMPLS.get(a.model)
    if impl is not None:
        out = impl(*args)
        if a.outputs:
            np.savez(a.outputs, out0=np.asarray(out))
        t = time_calls(lambda: impl(*args), QUICK if a.quick else FULL)
        _emit("numpy", ok=True, timing=t.to_json())
    if a.reference:
        import hlotune

        try:
            t0 = time.perf_counter()
            refs = hlotune.reference_run(str(bench_hlo_path(a.model, entry)), args)
            np.savez(a.reference, **{f"out{i}": np.asarray(x) for i, x in enumerate(refs)})
            _emit("reference", ok=True, wall_s=time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            _emit("reference", ok=False, error=_one_line(e))


def run_steps(a: argparse.Namespace) -> int:
    entry = load_manifest()["models"][a.model]
    with np.load(a.inputs) as z:
        args = [z[f"arg{i}"] for i in range(len(z.files))]
    (_hlotune_steps if a.side == "hlotune" else _baseline_steps)(a, entry, args)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--side", choices=("hlotune", "numpy"), default="hlotune",
                    help="hlotune: compile + time; numpy: the numpy version (+ --reference)")
    ap.add_argument("--outputs", help="where to save this side's outputs (npz)")
    ap.add_argument("--tuning-log", default=None, help="hlotune side: compile with this tuning database")
    ap.add_argument("--reference", help="numpy side: also run the reference interpreter, outputs here")
    ap.add_argument("--quick", action="store_true")
    return run_steps(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
