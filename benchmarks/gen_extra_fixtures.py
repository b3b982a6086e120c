"""Write extra HLO fixtures with JAX: small programs exercising opcodes and attributes that the
shared fixtures (tests/data/models) do not.

JAX is not a runtime dependency of hlotune; run this script in a side virtual environment outside
the repository:

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax jaxlib numpy
    /tmp/jaxenv/bin/python benchmarks/gen_extra_fixtures.py [OUT_DIR]

OUT_DIR defaults to tests/data/extra.  For each program NAME it writes OUT_DIR/NAME/:
  NAME.hlo       pre-optimization HLO: jax.jit(f).lower(*args).compiler_ir("hlo").as_hlo_text()
  NAME.opt.hlo   XLA CPU optimized HLO: jax.jit(f).lower(*args).compile().as_text()
  NAME.npz       arg0.. inputs (call order), out0.. JAX's jit outputs on the CPU (tree_leaves order)
and OUT_DIR/manifest.json listing the programs (opcodes, dtypes, the source of each, versions).
Inputs are seeded (numpy default_rng(zlib.crc32(name))) so reruns give the same files.
"""

from __future__ import annotations

import inspect
import json
import platform
import re
import shutil
import sys
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_platforms", "cpu")

PROGRAMS: dict[str, tuple] = {}  # name -> (function, make_args(rng), note, x64)


def program(note: str, x64: bool = False):
    """Register `f(*args)` with its argument maker `f.args(rng)` under f's name."""
    def wrap(f):
        PROGRAMS[f.__name__] = (f, note, x64)
        return f
    return wrap


def normal(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- data movement

@program("concatenate; pad with negative low/high and interior padding")
def concat_pad(x, y):
    c = jnp.concatenate([x, y, x * 2.0], axis=1)
    p = lax.pad(c, jnp.float32(-1.5), [(1, -2, 1), (-1, 2, 2)])
    return c, p


concat_pad.args = lambda rng: [normal(rng, 3, 4), normal(rng, 3, 2)]


@program("slice with strides; reverse")
def strided_slice_reverse(x):
    return x[1::2, ::3], x[::-1, 2:7:2], jnp.flip(x, axis=(0, 1)) + 1.0


strided_slice_reverse.args = lambda rng: [normal(rng, 5, 9)]


@program("dynamic-slice and dynamic-update-slice with runtime s32 offsets (one out of range: clamped)")
def dyn_slice_update(x, u, i, j):
    s = lax.dynamic_slice(x, (i, j), (2, 3))
    t = lax.dynamic_update_slice(x, u, (j, i))
    return s * 2.0, t


dyn_slice_update.args = lambda rng: [normal(rng, 5, 6), normal(rng, 2, 3), np.int32(2), np.int32(7)]


@program("gather from x[idx] (negative indices), jnp.take along an axis, take with clip mode")
def gather_take(x, idx, idx2):
    a = x[idx]
    b = jnp.take(x, idx2, axis=1)
    c = jnp.take(x, idx2, axis=0, mode="clip")
    return a, b, c


gather_take.args = lambda rng: [normal(rng, 6, 5), np.array([0, 5, -1, 2, -6], np.int32),
                                np.array([[1, 4], [0, 9]], np.int32)]


@program("iota/arange in several dtypes and dimensions")
def iota_arange(x):
    r = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    i = lax.broadcasted_iota(jnp.int32, (3, 4), 0) * 10 + lax.broadcasted_iota(jnp.int32, (3, 4), 1)
    return x + r, i, jnp.arange(5) * 3


iota_arange.args = lambda rng: [normal(rng, 3, 4)]


# --------------------------------------------------------------------------- reductions and windows

@program("argmax / argmin (variadic reduce), max with keepdims")
def argmax_argmin(x):
    return jnp.argmax(x, axis=1), jnp.argmin(x, axis=0), jnp.max(x, axis=-1, keepdims=True)


argmax_argmin.args = lambda rng: [normal(rng, 4, 7)]


@program("cumsum / cummax / cumprod (reduce-window with padding on the CPU)")
def cumulative(x):
    return jnp.cumsum(x, axis=1), lax.cummax(x, axis=0), jnp.cumprod(x * 0.5 + 1.0, axis=1)


cumulative.args = lambda rng: [normal(rng, 4, 6)]


@program("max-pool and avg-pool: reduce-window with strides and SAME/explicit padding")
def pools(x):
    mx = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    sm = lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 1, 1), ((0, 0), (1, 0), (0, 1), (0, 0)))
    return mx, sm / 4.0


pools.args = lambda rng: [normal(rng, 2, 7, 6, 3)]


@program("reduce-window with window dilation and base dilation")
def dilated_window(x):
    return lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 2), ((1, 1), (0, 1)),
                             base_dilation=(2, 1), window_dilation=(1, 2))


dilated_window.args = lambda rng: [normal(rng, 4, 7)]


# --------------------------------------------------------------------------- convolution and dot

@program("convolution with stride, padding, lhs (transposed conv) and rhs dilation")
def conv_dilated(x, w):
    a = lax.conv_general_dilated(x, w, (2, 1), ((1, 2), (0, 1)), rhs_dilation=(1, 2),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    b = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return a, b


conv_dilated.args = lambda rng: [normal(rng, 2, 6, 7, 3), normal(rng, 3, 2, 3, 4)]


@program("depthwise convolution (feature_group_count = channels)")
def conv_depthwise(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=4,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


conv_depthwise.args = lambda rng: [normal(rng, 2, 5, 5, 4), normal(rng, 3, 3, 1, 8)]


@program("convolution in NCHW / OIHW layout, grouped (2 groups), stride 2")
def conv_nchw(x, w):
    return lax.conv_general_dilated(x, w, (2, 2), "VALID", feature_group_count=2,
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


conv_nchw.args = lambda rng: [normal(rng, 2, 4, 7, 6), normal(rng, 6, 2, 3, 2)]


@program("dot_general: batch dims not leading, contraction on non-last dims, two batch dims")
def dot_general_unusual(a, b, c, d):
    e = lax.dot_general(a, b, (((0,), (2,)), ((2,), (0,))))
    f = lax.dot_general(c, d, (((3, 1), (1, 3)), ((0, 2), (2, 0))))
    return e, f


dot_general_unusual.args = lambda rng: [normal(rng, 3, 4, 2), normal(rng, 2, 5, 3),
                                        normal(rng, 2, 3, 4, 5), normal(rng, 4, 5, 2, 3)]


@program("bf16 matmul (bf16 result and f32 preferred_element_type)")
def bf16_matmul(a, b):
    return jnp.dot(a, b), jnp.dot(a, b, preferred_element_type=jnp.float32)


bf16_matmul.args = lambda rng: [normal(rng, 4, 8).astype(jnp.bfloat16), normal(rng, 8, 3).astype(jnp.bfloat16)]


# --------------------------------------------------------------------------- elementwise math

@program("clamp, round (half to even), sign, floor, ceil, abs")
def rounding(x):
    return (jnp.clip(x, -1.0, 0.5), lax.clamp(-0.25, x, 2.0), jnp.round(x * 2.0), jnp.sign(x), jnp.floor(x),
            jnp.ceil(x), jnp.abs(x))


rounding.args = lambda rng: [np.concatenate([normal(rng, 10) * 3, np.array([0.5, 1.5, -2.5, 0.0, -0.0, 2.0],
                                                                             np.float32)])]


@program("expm1, log1p, erf, atan2, pow, logistic, remainder")
def transcendental(x, y):
    return (jnp.expm1(x), jnp.log1p(jnp.abs(x)), lax.erf(x), jnp.arctan2(x, y),
            lax.pow(jnp.abs(y) + 0.1, x), jax.nn.sigmoid(x), lax.rem(x * 3.0, y), jnp.remainder(x * 3.0, y))


transcendental.args = lambda rng: [normal(rng, 3, 5), normal(rng, 3, 5)]


@program("s32 divide / remainder with negatives, floor_divide, integer max/min/abs/sign, bitwise and/or/xor/not")
def int_ops(a, b):
    return (lax.div(a, b), lax.rem(a, b), jnp.floor_divide(a, b), jnp.remainder(a, b),
            jnp.maximum(a, b) - jnp.minimum(a, b), jnp.abs(a) * jnp.sign(b),
            (a & b) | (a ^ ~b), jnp.sum(a * b, axis=0))


int_ops.args = lambda rng: [rng.integers(-50, 50, (3, 6)).astype(np.int32),
                            np.array([[3, -3, 7, -7, 1, -1]] * 3, np.int32)]


@program("comparisons with NaN inputs (all directions), select with a pred argument, is_finite, nan/inf constants")
def nan_compare(x, y, p):
    cmp = (x < y, x <= y, x == y, x != y, x > y, x >= y)
    w = jnp.where(jnp.isfinite(x), x, jnp.nan)
    z = jnp.where(p, jnp.inf, -jnp.inf) + y
    return (*cmp, lax.select(p, x, y), jnp.isfinite(x), w, z, jnp.maximum(x, y))


nan_compare.args = lambda rng: [np.array([1.0, np.nan, -np.inf, np.inf, 0.0, np.nan, 2.0], np.float32),
                                np.array([np.nan, 1.0, -np.inf, 3.0, -0.0, np.nan, 2.0], np.float32),
                                np.array([True, False, True, True, False, False, True])]


@program("convert f32 <-> s32 (truncation), bf16, f16, pred, with rounding to the narrow types")
def converts(x, i):
    return (x.astype(jnp.int32), i.astype(jnp.float32) * 0.5, x.astype(jnp.bfloat16),
            x.astype(jnp.float16), (x.astype(jnp.bfloat16) * 3).astype(jnp.float32),
            (x.astype(jnp.float16) + 1).astype(jnp.float32), (x > 0).astype(jnp.int32),
            (i != 0).astype(jnp.float32))


converts.args = lambda rng: [np.concatenate([normal(rng, 8) * 100, np.array([1.0039062, -2.5, 65504.0, 1e-6],
                                                                              np.float32)]),
                             rng.integers(-3, 3, 12).astype(np.int32)]


@program("f16 elementwise and reduction (f16 arithmetic with f32 accumulation in JAX's sum)")
def f16_math(x, y):
    return jnp.tanh(x) * y + x, jnp.sum(x * y, axis=1), jnp.exp(x) / (1 + jnp.abs(y))


f16_math.args = lambda rng: [normal(rng, 4, 6, dtype=np.float16), normal(rng, 4, 6, dtype=np.float16)]


@program("f64 and s64 with jax_enable_x64", x64=True)
def f64_math(x, i):
    y = jnp.sin(x) * jnp.exp(-x * x) + jnp.float64(1e-12)
    return y, jnp.sum(y, axis=0), i * 3 - jnp.int64(2 ** 40), x.astype(jnp.float32)


f64_math.args = lambda rng: [rng.standard_normal((3, 4)), rng.integers(-100, 100, 4).astype(np.int64)]


@program("a small layer mixing the above: softmax over a gathered embedding, log_softmax, one_hot, top-1 mask")
def embed_softmax(table, ids, labels):
    e = table[ids]  # [n, d]
    logits = e @ table.T
    lsm = jax.nn.log_softmax(logits, axis=-1)
    loss = -jnp.sum(lsm * jax.nn.one_hot(labels, table.shape[0]), axis=-1)
    top = logits == jnp.max(logits, axis=-1, keepdims=True)
    return loss, top, jnp.mean(loss)


embed_softmax.args = lambda rng: [normal(rng, 6, 4), np.array([0, 3, 5, 1], np.int32),
                                  np.array([1, 3, 2, 0], np.int32)]


@program("gather with batching: take_along_axis, vmapped dynamic_slice, 2-d point gather")
def gather_batched(x, idx, starts, pts):
    a = jnp.take_along_axis(x, idx, axis=1)
    b = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (3,)))(x, starts)
    c = x[pts[:, 0], pts[:, 1]]
    return a, b, c


gather_batched.args = lambda rng: [normal(rng, 4, 6), rng.integers(0, 6, (4, 5)).astype(np.int32),
                                   np.array([0, 5, -2, 3], np.int32), np.array([[0, 1], [3, 5], [2, 2]], np.int32)]


@program("reductions: any/all on pred, int min, sum over non-adjacent axes, sum with initial, u8/u32/s8 types")
def reductions_mixed(x, i, u):
    return (jnp.any(x > 1.0, axis=1), jnp.all(x > -2.0, axis=(0, 2)), jnp.min(i, axis=0),
            jnp.sum(x, axis=(0, 2)), jnp.sum(x, axis=1, initial=10.0), jnp.max(u, axis=1),
            (u // jnp.uint8(3)).astype(jnp.float32), (i.astype(jnp.int8) * 3).astype(jnp.int32),
            jnp.sum(u.astype(jnp.uint32), axis=0))


reductions_mixed.args = lambda rng: [normal(rng, 3, 4, 5), rng.integers(-9, 9, (3, 4)).astype(np.int32),
                                     rng.integers(0, 255, (3, 4)).astype(np.uint8)]


@program("convolution gradients (reversed kernels, lhs dilation, batch_group_count), 1-d conv")
def conv_grad(x, w, x1, w1):
    def loss(x, w):
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(y * y)
    gx, gw = jax.grad(loss, argnums=(0, 1))(x, w)
    y1 = lax.conv_general_dilated(x1, w1, (1,), ((2, 1),), dimension_numbers=("NWC", "WIO", "NWC"))
    return gx, gw, y1


conv_grad.args = lambda rng: [normal(rng, 2, 6, 5, 3), normal(rng, 3, 3, 3, 2), normal(rng, 2, 7, 2),
                              normal(rng, 3, 2, 4)]


@program("integer matmul, integer_pow, clamp with array bounds, scalar-pred select, transposes of rank 4")
def int_matmul_misc(a, b, x, lo, hi, flag):
    m = jnp.dot(a, b)
    p = x ** 3 + lax.integer_pow(x, -2)
    c = lax.clamp(lo, x, hi)
    s = lax.select(flag, x, -x)
    t = jnp.transpose(x.reshape(2, 3, 2, 2), (2, 0, 3, 1)) * 2.0
    return m, p, c, s, t


int_matmul_misc.args = lambda rng: [rng.integers(-5, 5, (3, 4)).astype(np.int32),
                                    rng.integers(-5, 5, (4, 2)).astype(np.int32), normal(rng, 4, 6) + 3.0,
                                    np.full((4, 6), 2.5, np.float32), np.full((4, 6), 3.5, np.float32),
                                    np.array(True)]


# --------------------------------------------------------------------------- writer

def _opcodes(text: str) -> list[str]:
    ops = set()
    for line in text.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?[%\w.\-]+\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(", line)
        if m:
            ops.add(m.group(1))
    return sorted(ops)


def write_one(name: str, out_dir: Path) -> dict:
    f, note, x64 = PROGRAMS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    with jax.enable_x64(x64):
        args = f.args(rng)
        jitted = jax.jit(f)
        lowered = jitted.lower(*args)
        hlo = lowered.compiler_ir("hlo").as_hlo_text()
        opt = lowered.compile().as_text()
        outs = [np.asarray(o) for o in jax.tree_util.tree_leaves(jitted(*args))]
    d = out_dir / name
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.hlo").write_text(hlo)
    (d / f"{name}.opt.hlo").write_text(opt)
    arrays = {f"arg{k}": np.asarray(a) for k, a in enumerate(args)}
    arrays.update({f"out{k}": o for k, o in enumerate(outs)})
    # bfloat16 is not a numpy dtype: store as float32 (exact), the HLO says the real type
    arrays = {k: (v.astype(np.float32) if v.dtype.name == "bfloat16" else v) for k, v in arrays.items()}
    np.savez_compressed(d / f"{name}.npz", **arrays)
    return {"note": note, "x64": x64, "jax_source": inspect.getsource(f) + inspect.getsource(f.args).strip(),
            "hlo_opcodes": _opcodes(hlo), "opt_hlo_opcodes": _opcodes(opt),
            "inputs": [f"{a.dtype.name}{list(np.shape(a))}" for a in args],
            "outputs": [f"{o.dtype.name}{list(o.shape)}" for o in outs]}


def main(argv: list[str]) -> None:
    out_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1] / "tests" / "data" / "extra"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    models = {name: write_one(name, out_dir) for name in PROGRAMS}
    manifest = {
        "generator": "benchmarks/gen_extra_fixtures.py (JAX programs in each model's 'jax_source' field, "
                     "lowered on the CPU backend)",
        "pre_opt_hlo_api": 'jax.jit(f).lower(*args).compiler_ir("hlo").as_hlo_text()',
        "post_opt_hlo_api": "jax.jit(f).lower(*args).compile().as_text()  (XLA CPU backend)",
        "npz_layout": "arg0.. inputs in call order; out0.. JAX jit CPU outputs in tree_leaves order; "
                      "bfloat16 arrays are stored as float32 (exact widening)",
        "input_seeds": "numpy.random.default_rng(zlib.crc32(b'<name>'))",
        "set": "extra",
        "versions": {"jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__")
                     else jax.__version__, "numpy": np.__version__, "python": platform.python_version()},
        "models": models,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    print(f"wrote {len(models)} programs to {out_dir} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main(sys.argv)
