"""The HLO front end on extra JAX programs (tests/data/extra, written by benchmarks/gen_extra_fixtures.py
in a side JAX environment) that exercise opcodes and attributes the shared fixtures do not: every
text parses, verifies and round-trips through the printer; the interpreter matches JAX's outputs;
optimize + fuse keeps the semantics; every fused subgraph's compute definition evaluates like the
interpreter (or is refused with the documented UnsupportedError).  Also tests
`passes.dedupe_computations`.

Tolerances (`assert_close`): integer and pred outputs exactly; f64 rtol 1e-12 / atol 1e-14; f32
rtol 1e-5 / atol 1e-6.  When a module computes in f16 or bf16 anywhere, its float outputs are compared
with rtol = eps and atol = eps * max|expected| for eps the machine epsilon of the narrowest such type
(2^-10 for f16, 2^-7 for bf16): XLA's CPU backend keeps chains of narrow-float ops in f32 and
rounds once at the end (excess precision is allowed), while the interpreter rounds after every HLO
op as the text says, so the two differ by about one rounding of the narrow type.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from hlotune.errors import UnsupportedError
from hlotune.ir.fusion import FusedProgram, fuse
from hlotune.ir.hlo import ArrayShape, Computation, DType, Instruction, Module, Op, TupleShape
from hlotune.ir.interp import evaluate, evaluate_computation, round_bf16
from hlotune.ir.parser import load_hlo, parse_hlo
from hlotune.ir.passes import cse, dce, dedupe_computations, optimize
from hlotune.ir.printer import print_module
from hlotune.ir.verify import verify_module

try:
    from hlotune.ir.compute import compute_definition
    from hlotune.ir.compute_eval import evaluate_compute
except ImportError:  # pragma: no cover - compute definitions not written yet
    compute_definition = evaluate_compute = None

EXTRA = Path(__file__).resolve().parents[1] / "data" / "extra"
MANIFEST = json.loads((EXTRA / "manifest.json").read_text())
NAMES = sorted(MANIFEST["models"])
TEXTS = [(n, s) for n in NAMES for s in ("hlo", "opt.hlo")]
IDS = [f"{n}.{s}" for n, s in TEXTS]
GLUE_OPS = {Op.PARAMETER, Op.CONSTANT, Op.FUSION, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.BITCAST, Op.RESHAPE}
MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


@functools.cache
def module(name: str, suffix: str) -> Module:
    return load_hlo(EXTRA / name / f"{name}.{suffix}")


@functools.cache
def program(name: str, suffix: str) -> FusedProgram:
    return fuse(optimize(module(name, suffix)))


def io(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    z = np.load(EXTRA / name / f"{name}.npz")
    n_in = sum(k.startswith("arg") for k in z.files)
    n_out = sum(k.startswith("out") for k in z.files)
    return [z[f"arg{i}"] for i in range(n_in)], [z[f"out{i}"] for i in range(n_out)]


def _array_shapes(shape):
    if isinstance(shape, TupleShape):
        for s in shape.elements:
            yield from _array_shapes(s)
    else:
        yield shape


def narrow_eps(m: Module) -> float | None:
    """Machine epsilon of the narrowest float type (f16/bf16) computed anywhere in `m`, or None."""
    dtypes = {s.dtype for c in m.computations for i in c for s in _array_shapes(i.shape)}
    if DType.BF16 in dtypes:
        return 2.0 ** -7
    if DType.F16 in dtypes:
        return 2.0 ** -10
    return None


def assert_close(got: np.ndarray, want: np.ndarray, eps: float | None, msg: str = "") -> None:
    """Compare one output with the tolerances of the module docstring."""
    assert got.shape == want.shape, msg
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=msg)
        return
    if eps is not None:
        finite = np.abs(want[np.isfinite(want)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        np.testing.assert_allclose(got, want, rtol=eps, atol=eps * scale, err_msg=msg)
    elif want.dtype == np.float64:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=msg)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=msg)


# --------------------------------------------------------------------------- the fixture set itself

def test_manifest_lists_every_directory_and_files_are_small():
    assert set(NAMES) == {p.name for p in EXTRA.iterdir() if p.is_dir()}
    assert len(NAMES) >= 20
    for n in NAMES:
        assert {p.name for p in (EXTRA / n).iterdir()} == {f"{n}.hlo", f"{n}.opt.hlo", f"{n}.npz"}
    assert sum(p.stat().st_size for p in EXTRA.rglob("*") if p.is_file()) < 1 << 20


def _all_instructions(suffix: str):
    return [i for n in NAMES for c in module(n, suffix).computations for i in c]


def test_extra_fixtures_cover_new_opcodes():
    want = {Op.CONCATENATE, Op.PAD, Op.SLICE, Op.DYNAMIC_SLICE, Op.DYNAMIC_UPDATE_SLICE, Op.GATHER, Op.IOTA,
            Op.REVERSE, Op.REDUCE_WINDOW, Op.CLAMP, Op.ROUND_NEAREST_EVEN, Op.SIGN, Op.FLOOR, Op.CEIL, Op.EXPM1,
            Op.LOG1P, Op.ERF, Op.ATAN2, Op.POWER, Op.REMAINDER, Op.ABS, Op.IS_FINITE, Op.CONVOLUTION, Op.DOT,
            Op.AND, Op.OR, Op.XOR, Op.NOT, Op.SELECT, Op.CONVERT, Op.COMPARE}
    assert want <= {i.op for i in _all_instructions("hlo")}
    shared = {i.op for p in MODELS.glob("*/*.hlo") if ".bench" not in p.name
              for c in load_hlo(p).computations for i in c}
    assert len(want - shared) >= 20


def test_extra_fixtures_cover_new_attributes():
    insts = _all_instructions("hlo")
    pads = [p for i in insts if i.op is Op.PAD for p in i.attr("padding")]
    assert any(lo < 0 or hi < 0 for lo, hi, _ in pads) and any(interior > 0 for _, _, interior in pads)
    assert any(s > 1 for i in insts if i.op is Op.SLICE for _, _, s in i.attr("slice"))
    convs = [i for i in insts if i.op is Op.CONVOLUTION]
    assert any(i.attr("feature_group_count", 1) > 1 for i in convs)
    windows = [d for i in insts if i.op in (Op.CONVOLUTION, Op.REDUCE_WINDOW) for d in i.attr("window").dims]
    for field in ("stride", "lhs_dilate", "rhs_dilate"):
        assert any(getattr(d, field) > 1 for d in windows), field
    assert any(d.pad_lo > 0 for d in windows) and any(d.pad_hi > 0 for d in windows)
    assert any(i.attr("dim_labels").input_feature == 1 for i in convs)  # NCHW
    assert any(i.op is Op.REDUCE and isinstance(i.shape, TupleShape) for i in insts)  # variadic (argmax)
    dtypes = {s.dtype for i in insts for s in _array_shapes(i.shape)}
    assert {DType.F16, DType.BF16, DType.F64, DType.S64, DType.S32, DType.PRED} <= dtypes
    dots = [i for i in insts if i.op is Op.DOT]
    assert any(i.attr("lhs_batch_dims") and i.attr("lhs_batch_dims")[0] != 0 for i in dots)


# --------------------------------------------------------------------------- front end on every text

@pytest.mark.parametrize(("name", "suffix"), TEXTS, ids=IDS)
def test_parse_verify_print_round_trip(name, suffix):
    m = module(name, suffix)
    verify_module(m)
    text = print_module(m)
    again = parse_hlo(text)
    assert again == m
    verify_module(again)
    assert print_module(again) == text


@pytest.mark.parametrize(("name", "suffix"), TEXTS, ids=IDS)
def test_interpreter_matches_jax(name, suffix):
    m = module(name, suffix)
    args, want = io(name)
    got = evaluate(m, args)
    assert len(got) == len(want)
    eps = narrow_eps(m)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"out{k}"
        assert_close(g, w, eps, f"out{k}")


@pytest.mark.parametrize(("name", "suffix"), TEXTS, ids=IDS)
def test_optimize_and_fuse_preserve_semantics(name, suffix):
    p = program(name, suffix)
    verify_module(p.module)
    entry = p.module.entry_computation
    assert {i.op for i in entry} <= GLUE_OPS
    assert [i.name for i in entry if i.op is Op.FUSION] == [s.name for s in p.subgraphs]
    args, want = io(name)
    got = evaluate(p.module, args)
    assert len(got) == len(want)
    eps = narrow_eps(module(name, suffix))
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"out{k}"
        assert_close(g, w, eps, f"out{k}")


# --------------------------------------------------------------------------- compute definitions

def random_input(shape: ArrayShape, rng: np.random.Generator) -> np.ndarray:
    """Standard normal floats (bf16-rounded for bf16), small signed ints (offsets, indices and
    divisors both in and out of range, zero included), random preds."""
    if shape.dtype is DType.PRED:
        return rng.random(shape.dims) < 0.5
    if shape.dtype.is_int:
        lo = 0 if shape.dtype in (DType.U8, DType.U32) else -4
        return rng.integers(lo, 9, shape.dims).astype(shape.dtype.np)
    x = rng.standard_normal(shape.dims).astype(shape.dtype.np)
    return round_bf16(x) if shape.dtype is DType.BF16 else x


def _leaves(v):
    return [v] if isinstance(v, np.ndarray) else [x for e in v for x in _leaves(e)]


@pytest.mark.parametrize("name", NAMES)
def test_texts_agree_on_random_inputs(name):
    """On random inputs (out-of-range offsets and indices, zero divisors included) the XLA-optimized
    text and both fused programs compute what the pre-optimization text computes."""
    pre = module(name, "hlo")
    eps = narrow_eps(pre)
    for seed in range(2):
        rng = np.random.default_rng(seed)
        args = [random_input(q.array_shape, rng) for q in pre.entry_computation.parameters]
        want = evaluate(pre, args)
        for label, m in (("opt.hlo", module(name, "opt.hlo")), ("fused hlo", program(name, "hlo").module),
                         ("fused opt.hlo", program(name, "opt.hlo").module)):
            got = evaluate(m, args)
            assert len(got) == len(want), label
            for k, (g, w) in enumerate(zip(got, want)):
                assert_close(g, w, eps, f"{label} seed {seed} out{k}")


#: what compute definitions refuse by design: instruction -> the message of the UnsupportedError
UNSUPPORTED_BY_DESIGN = (
    (lambda i: i.op in (Op.REDUCE, Op.REDUCE_WINDOW) and isinstance(i.shape, TupleShape),
     lambda i: f"tuple-shaped {i.op} inside a fused computation"),
    (lambda i: i.op is Op.GATHER and bool(i.attr("operand_batching_dims", ())), lambda i: "gather with batching dims"),
    (lambda i: i.op is Op.CONVOLUTION and i.attr("batch_group_count", 1) > 1,
     lambda i: "convolution with batch_group_count > 1"),
)


def unsupported(comp: Computation) -> dict[str, str]:
    """Instructions of `comp` that compute definitions refuse by design -> the expected message."""
    return {i.name: msg(i) for i in comp for pred, msg in UNSUPPORTED_BY_DESIGN if pred(i)}


#: fixtures with subgraphs refused by design (every other subgraph must be checked)
EXPECT_REFUSED = {"argmax_argmin": {"hlo": 2, "opt.hlo": 2}, "gather_batched": {"hlo": 2, "opt.hlo": 0}}


@pytest.mark.skipif(compute_definition is None, reason="hlotune.ir.compute not available")
@pytest.mark.parametrize(("name", "suffix"), TEXTS, ids=IDS)
def test_compute_definitions_match_interpreter(name, suffix):
    p = program(name, suffix)
    eps = narrow_eps(module(name, suffix))
    refused = 0
    for s in p.subgraphs:
        expected = unsupported(s.computation)
        if expected:  # refused by design, with an error naming the instruction
            with pytest.raises(UnsupportedError) as err:
                compute_definition(s.computation, p.module)
            assert err.value.op in expected, str(err.value)
            assert err.value.message == expected[err.value.op]
            assert err.value.line == s.computation[err.value.op].line
            refused += 1
            continue
        cd = compute_definition(s.computation, p.module)
        rng = np.random.default_rng(0)
        args = [random_input(q.array_shape, rng) for q in s.computation.parameters]
        want = _leaves(evaluate_computation(p.module, s.computation, args))
        got = evaluate_compute(cd, args)
        assert len(got) == len(want), s.name
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype, f"{s.name} out{k}"
            assert_close(g, w, eps, f"{s.name} out{k}")
    assert refused == EXPECT_REFUSED.get(name, {}).get(suffix, 0)


# --------------------------------------------------------------------------- dedupe_computations

TWO_REGIONS = """
HloModule m

region_0.1 {
  a.1 = f32[] parameter(0)
  b.1 = f32[] parameter(1)
  ROOT s.1 = f32[] add(a.1, b.1), metadata={op_name="x"}
}

region_1.2 {
  p.2 = f32[] parameter(0)
  q.2 = f32[] parameter(1)
  ROOT t.2 = f32[] add(p.2, q.2)
}

region_max.3 {
  p.3 = f32[] parameter(0)
  q.3 = f32[] parameter(1)
  ROOT t.3 = f32[] maximum(p.3, q.3)
}

region_swapped.4 {
  p.4 = f32[] parameter(0)
  q.4 = f32[] parameter(1)
  ROOT t.4 = f32[] add(q.4, p.4)
}

ENTRY main.5 {
  x = f32[4,8]{1,0} parameter(0)
  zero = f32[] constant(0)
  r0 = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=region_0.1
  r1 = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=region_1.2
  r2 = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=region_max.3
  r3 = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=region_swapped.4
  ROOT t = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}) tuple(r0, r1, r2, r3)
}
"""


def test_dedupe_merges_computations_equal_modulo_names():
    m = parse_hlo(TWO_REGIONS)
    d = dedupe_computations(m)
    verify_module(d)
    # region_1.2 equals region_0.1 modulo names and metadata; max and swapped operands differ
    assert [c.name for c in d.computations] == ["region_0.1", "region_max.3", "region_swapped.4", "main.5"]
    entry = d.entry_computation
    assert [entry[r].attr("to_apply") for r in ("r0", "r1", "r2", "r3")] == [
        "region_0.1", "region_0.1", "region_max.3", "region_swapped.4"]
    c = dce(cse(d))
    assert sum(i.op is Op.REDUCE for i in c.entry_computation) == 3
    args = [np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)]
    for g, w in zip(evaluate(c, args), evaluate(m, args), strict=True):
        np.testing.assert_array_equal(g, w)
    assert dedupe_computations(d) is d  # nothing left to merge


def test_dedupe_follows_nested_calls():
    """Two fused computations that differ only in which (equal) combiner their reduce calls merge
    too, because callees are deduplicated first."""
    text = TWO_REGIONS.split("ENTRY")[0] + """
fused_a {
  x = f32[4,8]{1,0} parameter(0)
  zero = f32[] constant(0)
  ROOT r = f32[4]{0} reduce(x, zero), dimensions={1}, to_apply=region_0.1
}

fused_b {
  y = f32[4,8]{1,0} parameter(0)
  c = f32[] constant(0)
  ROOT s = f32[4]{0} reduce(y, c), dimensions={1}, to_apply=region_1.2
}

ENTRY main {
  x = f32[4,8]{1,0} parameter(0)
  f0 = f32[4]{0} fusion(x), kind=kInput, calls=fused_a
  f1 = f32[4]{0} fusion(x), kind=kInput, calls=fused_b
  ROOT t = (f32[4]{0}, f32[4]{0}) tuple(f0, f1)
}
"""
    m = parse_hlo(text)
    d = dce(cse(dedupe_computations(m)))
    verify_module(d)
    fusions = [i for i in d.entry_computation if i.op is Op.FUSION]
    assert [f.attr("calls") for f in fusions] == ["fused_a"]
    assert {c.name for c in d.computations} == {"region_0.1", "fused_a", "main"}


def test_optimize_merges_layernorm_mean_reductions():
    """layernorm.hlo computes mean(x) twice with combiners region_0.1 and region_1.2 (equal modulo
    names): after optimize one reduce of x is left, and one combiner."""
    m = load_hlo(MODELS / "layernorm" / "layernorm.hlo")
    assert len({c.name for c in m.computations if c.name.startswith("region")}) == 3
    o = optimize(m)
    reduces = [i for i in o.entry_computation if i.op is Op.REDUCE]
    assert len(reduces) == 2  # sum(x) and sum((x - mean)^2)
    assert len({i.attr("to_apply") for i in reduces}) == 1
    assert len(o.computations) == 2
    z = np.load(MODELS / "layernorm" / "layernorm.npz")
    args = [z[f"arg{i}"] for i in range(3)]
    np.testing.assert_allclose(evaluate(o, args)[0], z["out0"], rtol=1e-5, atol=1e-6)


def test_dedupe_keeps_instructions_with_different_attributes_apart():
    base = Instruction("p", Op.PARAMETER, ArrayShape(DType.F32, (2,)), (), (("parameter_number", 0),))
    bc = Instruction("b", Op.BROADCAST, ArrayShape(DType.F32, (2, 2)), ("p",), (("dimensions", (0,)),))
    bc1 = bc.replace(attrs=(("dimensions", (1,)),))
    c0 = Computation("c0", (base, bc), "b")
    c1 = Computation("c1", (base, bc1), "b")
    c2 = Computation("c2", (base.replace(name="q"), bc.replace(name="d", operands=("q",))), "d")
    entry = Computation("main", (base, Instruction("t", Op.TUPLE, TupleShape((bc.shape,) * 3), ("x0", "x1", "x2"))),
                        "t", is_entry=True)
    calls = tuple(Instruction(f"x{k}", Op.CALL, bc.shape, ("p",), (("to_apply", f"c{k}"),)) for k in range(3))
    entry = Computation("main", (base, *calls, entry["t"]), "t", is_entry=True)
    m = Module("m", (c0, c1, c2, entry), "main")
    verify_module(m)
    d = dedupe_computations(m)
    assert [c.name for c in d.computations] == ["c0", "c1", "main"]
    assert [d.entry_computation[f"x{k}"].attr("to_apply") for k in range(3)] == ["c0", "c1", "c0"]
    x = np.array([1.0, 2.0], np.float32)
    for g, w in zip(evaluate(d, [x]), evaluate(m, [x]), strict=True):
        np.testing.assert_array_equal(g, w)
