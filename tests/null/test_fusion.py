"""Fusion: semantics of the glue module (interpreter vs JAX / the un-optimized module), the shape of
the glue entry, and the fusion structure XLA-style rules give on the fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hlotune.ir.fusion import FusedProgram, fuse
from hlotune.ir.hlo import Op
from hlotune.ir.interp import evaluate
from hlotune.ir.parser import load_hlo, parse_hlo
from hlotune.ir.passes import optimize
from hlotune.ir.verify import verify_module

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
GLUE_OPS = {Op.PARAMETER, Op.CONSTANT, Op.FUSION, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.BITCAST, Op.RESHAPE}
FIXTURES = sorted(p for p in MODELS.glob("*/*.hlo") if ".bench" not in p.name)
#: GPU texts at bench size that the interpreter evaluates quickly
GPU_FIXTURES = ["batch_matmul", "conv2d_bias_relu", "dense_bias_relu", "layernorm", "matmul", "mlp2",
                "mlp_train_step", "row_sum", "softmax", "sum_reduce", "transformer_block"]


def program(path) -> FusedProgram:
    return fuse(optimize(load_hlo(path)))


def fixture_args(name):
    d = np.load(MODELS / name / f"{name}.npz")
    n_in = sum(k.startswith("arg") for k in d.files)
    n_out = sum(k.startswith("out") for k in d.files)
    return [d[f"arg{i}"] for i in range(n_in)], [d[f"out{i}"] for i in range(n_out)]


def check_structure(p: FusedProgram) -> None:
    """Glue entry holds only glue ops; subgraphs match the fusion instructions in execution order;
    every fusion reads only values defined before it (no cycles)."""
    verify_module(p.module)
    entry = p.module.entry_computation
    assert {i.op for i in entry} <= GLUE_OPS
    fusions = [i for i in entry if i.op is Op.FUSION]
    assert [f.name for f in fusions] == [s.name for s in p.subgraphs]
    defined: set[str] = set()
    for inst in entry:
        assert set(inst.operands) <= defined, inst.name
        defined.add(inst.name)
    for f, s in zip(fusions, p.subgraphs):
        assert p.module.computation(f.attr("calls")) == s.computation
        assert f.attr("kind") in ("kLoop", "kInput", "kOutput", "kCustom")
        assert s.kind in ("loop", "input", "output", "opaque")
        assert len(s.computation.parameters) == len(f.operands)
        assert Op.FUSION not in {i.op for i in s.computation}
    for i in entry:
        if i.op in (Op.BITCAST, Op.RESHAPE):
            assert entry[i.operands[0]].op in (Op.PARAMETER, Op.BITCAST, Op.RESHAPE)


def count(p: FusedProgram, ops) -> int:
    return sum(1 for s in p.subgraphs for i in s.computation if i.op in ops)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fused_program_matches_jax(path):
    p = program(path)
    check_structure(p)
    args, outs = fixture_args(path.parent.name)
    for got, want in zip(evaluate(p.module, args), outs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_fused_gpu_text_matches_unoptimized(name):
    ref = load_hlo(MODELS / name / f"{name}.bench.hlo")
    p = program(MODELS / name / f"{name}.bench.gpu.opt.hlo")
    check_structure(p)
    assert count(p, {Op.CUSTOM_CALL}) == 0  # legalized
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(q.array_shape.dims).astype(np.float32) for q in ref.entry_computation.parameters]
    for got, want in zip(evaluate(p.module, args), evaluate(ref, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_no_fusion_has_two_contractions(path):
    p = program(path)
    m = load_hlo(path)
    honoured = {i.name for i in m.entry_computation if i.op is Op.FUSION}
    for s in p.subgraphs:
        if s.name not in honoured:
            assert sum(i.op in (Op.DOT, Op.CONVOLUTION) for i in s.computation) <= 1, s.name
            heavy = [i for i in s.computation if i.op in (Op.DOT, Op.CONVOLUTION, Op.REDUCE, Op.REDUCE_WINDOW)]
            assert len({i.op for i in heavy} & {Op.DOT, Op.CONVOLUTION}) == 0 or len(heavy) == 1, s.name


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_expensive_ops_not_duplicated(path):
    m = optimize(load_hlo(path))
    p = fuse(m)
    expensive = {Op.DOT, Op.CONVOLUTION, Op.REDUCE, Op.REDUCE_WINDOW, Op.EXP, Op.LOG, Op.TANH, Op.SINE}
    before = sum(1 for i in m.entry_computation if i.op in expensive)
    before += sum(1 for i in m.entry_computation if i.op is Op.FUSION
                  for j in m.computation(i.attr("calls")) if j.op in expensive)
    assert count(p, expensive) == before


# --------------------------------------------------------------------------- structure on fixtures

def kinds(p):
    return [s.kind for s in p.subgraphs]


def sub_ops(s):
    return {i.op for i in s.computation}


def test_dense_bias_relu_is_one_output_fusion():
    p = program(MODELS / "dense_bias_relu" / "dense_bias_relu.hlo")
    assert kinds(p) == ["output"]
    assert {Op.DOT, Op.ADD, Op.MAXIMUM} <= sub_ops(p.subgraphs[0])
    assert p.module.entry_computation.root_instruction.op is Op.FUSION


def test_conv_bias_relu_gpu_is_one_output_fusion_after_legalization():
    p = program(MODELS / "conv2d_bias_relu" / "conv2d_bias_relu.bench.gpu.opt.hlo")
    conv = [s for s in p.subgraphs if Op.CONVOLUTION in sub_ops(s)]
    assert len(conv) == 1 and conv[0].kind == "output" and {Op.ADD, Op.MAXIMUM} <= sub_ops(conv[0])
    assert "wrapped_transpose" in [s.name for s in p.subgraphs]  # the existing fusion, honoured


def test_sin_mul_add_is_one_loop_fusion():
    p = program(MODELS / "sin_mul_add" / "sin_mul_add.hlo")
    assert kinds(p) == ["loop"]
    assert {Op.SINE, Op.MULTIPLY, Op.ADD} <= sub_ops(p.subgraphs[0])


def test_softmax_reductions_fuse_with_their_producers(monkeypatch):
    monkeypatch.setenv("HLOTUNE_ROW_FUSION", "0")   # with row fusion: one subgraph (test_row_fusion_rules.py)
    p = program(MODELS / "softmax" / "softmax.hlo")
    reduces = [s for s in p.subgraphs if Op.REDUCE in sub_ops(s)]
    assert len(reduces) == 2 and all(s.kind == "input" for s in reduces)
    assert all(sum(i.op is Op.REDUCE for i in s.computation) == 1 for s in reduces)
    assert any({Op.EXP, Op.SUBTRACT} <= sub_ops(s) for s in reduces)
    assert len(p.subgraphs) <= 3


def test_layernorm_reductions_are_input_fusions():
    p = program(MODELS / "layernorm" / "layernorm.hlo")
    for s in p.subgraphs:
        if Op.REDUCE in sub_ops(s):
            assert s.kind == "input"
    assert len(p.subgraphs) <= 3
    assert count(p, {Op.SQRT}) == 1


def test_transformer_block_duplicates_no_dot():
    m = optimize(load_hlo(MODELS / "transformer_block" / "transformer_block.hlo"))
    p = fuse(m)
    n_dots = sum(i.op is Op.DOT for i in m.entry_computation)
    assert count(p, {Op.DOT}) == n_dots
    assert sum(s.kind == "output" for s in p.subgraphs) == n_dots


def test_existing_fusions_are_honoured():
    path = MODELS / "softmax" / "softmax.opt.hlo"
    m = load_hlo(path)
    p = program(path)
    original = {i.name: m.computation(i.attr("calls")) for i in m.entry_computation if i.op is Op.FUSION}
    by_name = {s.name: s for s in p.subgraphs}
    assert set(original) == set(by_name)
    for name, comp in original.items():
        assert [i.op for i in by_name[name].computation] == [i.op for i in comp]


def test_nested_fusions_are_inlined():
    path = MODELS / "transformer_block" / "transformer_block.bench.gpu.opt.hlo"
    p = program(path)
    assert all(Op.FUSION not in sub_ops(s) for s in p.subgraphs)


# --------------------------------------------------------------------------- hand-written cases

def module(body: str, params: str = "x = f32[16,64]{1,0} parameter(0)") -> object:
    regions = ("add_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
               "max_f {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] maximum(a, b)\n}\n")
    return parse_hlo(f"HloModule t\n\n{regions}\nENTRY main {{\n  {params}\n{body}\n}}\n")


def check_semantics(m, p):
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(q.array_shape.dims).astype(np.float32) for q in m.entry_computation.parameters]
    for got, want in zip(evaluate(p.module, args), evaluate(m, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_expensive_producer_becomes_multi_output_not_duplicated(monkeypatch):
    # e = exp(x) feeds a reduce and a consumer of that reduce: fusing e into the consumer would make
    # a cycle, duplicating it would recompute exp; it goes into the reduce fusion as an extra output.
    # (Row fusion would make this softmax-like graph one subgraph: off here, see test_row_fusion_rules.py.)
    monkeypatch.setenv("HLOTUNE_ROW_FUSION", "0")
    m = module("  e = f32[16,64]{1,0} exponential(x)\n  z = f32[] constant(0)\n"
               "  r = f32[16]{0} reduce(e, z), dimensions={1}, to_apply=add_f\n"
               "  b = f32[16,64]{1,0} broadcast(r), dimensions={0}\n  ROOT d = f32[16,64]{1,0} divide(e, b)")
    p = fuse(m)
    check_structure(p)
    assert count(p, {Op.EXP}) == 1
    red = [s for s in p.subgraphs if Op.REDUCE in sub_ops(s)]
    assert red[0].computation.root_instruction.op is Op.TUPLE and Op.EXP in sub_ops(red[0])
    check_semantics(m, p)


def test_cheap_producer_is_duplicated_into_two_reductions():
    m = module("  n = f32[16,64]{1,0} negate(x)\n  z = f32[] constant(0)\n  y = f32[16,64]{1,0} parameter(1)\n"
               "  r1 = f32[16]{0} reduce(n, z), dimensions={1}, to_apply=add_f\n"
               "  m1 = f32[16,64]{1,0} multiply(n, y)\n"
               "  r2 = f32[16]{0} reduce(m1, z), dimensions={1}, to_apply=max_f\n"
               "  ROOT t = (f32[16]{0}, f32[16]{0}) tuple(r1, r2)")
    p = fuse(m)
    check_structure(p)
    assert count(p, {Op.NEGATE}) == 2 or len(p.subgraphs) == 1  # duplicated, or siblings merged
    assert all(s.kind == "input" for s in p.subgraphs)
    check_semantics(m, p)


def test_reduce_never_fused_into_another_reduce(monkeypatch):
    monkeypatch.setenv("HLOTUNE_ROW_FUSION", "0")   # row fusion's exception: test_row_fusion_rules.py
    m = module("  z = f32[] constant(0)\n  r1 = f32[16]{0} reduce(x, z), dimensions={1}, to_apply=add_f\n"
               "  b = f32[16,64]{1,0} broadcast(r1), dimensions={0}\n  s = f32[16,64]{1,0} subtract(x, b)\n"
               "  r2 = f32[16]{0} reduce(s, z), dimensions={1}, to_apply=max_f\n  ROOT o = f32[16]{0} negate(r2)")
    p = fuse(m)
    check_structure(p)
    assert len(p.subgraphs) == 2
    assert all(sum(i.op is Op.REDUCE for i in s.computation) == 1 for s in p.subgraphs)
    assert Op.NEGATE in sub_ops(p.subgraphs[1])  # the elementwise epilogue joins the second reduce
    check_semantics(m, p)


def test_dot_takes_epilogue_and_data_movement_producers_only():
    m = module("  w = f32[32,64]{1,0} parameter(1)\n  wt = f32[64,32]{1,0} transpose(w), dimensions={1,0}\n"
               "  xe = f32[16,64]{1,0} exponential(x)\n"
               "  d = f32[16,32]{1,0} dot(xe, wt), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
               "  ROOT t = f32[16,32]{1,0} tanh(d)")
    p = fuse(m)
    check_structure(p)
    dot = [s for s in p.subgraphs if Op.DOT in sub_ops(s)][0]
    assert dot.kind == "output" and {Op.TRANSPOSE, Op.TANH} <= sub_ops(dot) and Op.EXP not in sub_ops(dot)
    check_semantics(m, p)


def test_no_fuse_setting(monkeypatch):
    monkeypatch.setenv("HLOTUNE_NO_FUSE", "1")
    m = optimize(load_hlo(MODELS / "sin_mul_add" / "sin_mul_add.hlo"))
    p = fuse(m)
    check_structure(p)
    assert len(p.subgraphs) == sum(i.op not in GLUE_OPS for i in m.entry_computation)
    check_semantics(m, p)
