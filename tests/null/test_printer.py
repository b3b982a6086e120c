"""The HLO printer: exact round trips through the parser, callee order, literal text."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hlotune.ir.hlo import (
    ArrayShape,
    Computation,
    ConvDims,
    DType,
    Instruction,
    Module,
    Op,
    Window,
    WindowDim,
    make_attrs,
)
from hlotune.ir.literal import format_literal, parse_literal
from hlotune.ir.parser import load_hlo, parse_and_verify, parse_hlo
from hlotune.ir.printer import format_dim_labels, print_instruction, print_module

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
FIXTURE_FILES = sorted(DATA.glob("*/*.hlo"))
_COMP_HEAD = re.compile(r"^(ENTRY )?([\w.\-]+) \(.*\) -> .* \{$")


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.name for p in FIXTURE_FILES])
def test_round_trip(path: Path) -> None:
    m = load_hlo(path)
    text = print_module(m)
    m2 = parse_hlo(text)
    assert m2 == m
    assert print_module(m2) == text
    # callees are defined before their callers; one ENTRY (the entry); one ROOT per computation
    heads = [_COMP_HEAD.match(line) for line in text.split("\n")]
    order = [h.group(2) for h in heads if h]
    assert sorted(order) == sorted(c.name for c in m.computations)
    assert [h.group(2) for h in heads if h and h.group(1)] == [m.entry]
    for c in m.computations:
        for i in c.instructions:
            for callee in i.called:
                assert order.index(callee) < order.index(c.name)
    assert text.count("\n  ROOT ") == len(m.computations)
    assert "%" not in "".join(line.split(", metadata=")[0] for line in text.split("\n")[1:])


def test_print_instruction_format() -> None:
    m = load_hlo(DATA / "conv2d_bias_relu" / "conv2d_bias_relu.opt.hlo")
    e = m.entry_computation
    assert print_instruction(e["x.1"]) == 'x.1 = f32[1,8,8,4]{3,2,1,0} parameter(0), metadata={op_name="x"}'
    assert print_instruction(e["conv_general_dilated.1"]) == (
        "conv_general_dilated.1 = f32[1,8,8,8]{3,2,1,0} convolution(x.1, w.1), dim_labels=b01f_01io->b01f, "
        'window={size=3x3 pad=1_1x1_1}, metadata={op_name="jit(conv2d_bias_relu)/conv_general_dilated" '
        "stack_frame_id=4}")
    c = m.computation("fused_computation")
    assert print_instruction(c["constant.2"]).startswith("constant.2 = f32[] constant(0), metadata=")


def test_callees_first_even_if_module_lists_them_last() -> None:
    callee = Computation("neg", (Instruction("a", Op.PARAMETER, ArrayShape(DType.F32, (2,)), (),
                                             make_attrs({"parameter_number": 0})),
                                 Instruction("b", Op.NEGATE, ArrayShape(DType.F32, (2,)), ("a",))), "b")
    entry = Computation("main", (Instruction("p", Op.PARAMETER, ArrayShape(DType.F32, (2,)), (),
                                             make_attrs({"parameter_number": 0})),
                                 Instruction("c", Op.CALL, ArrayShape(DType.F32, (2,)), ("p",),
                                             make_attrs({"to_apply": "neg"}))), "c", True)
    m = Module("m", (entry, callee), "main")
    text = print_module(m)
    assert text.index("neg (a: f32[2]) -> f32[2] {") < text.index("ENTRY main (p: f32[2]) -> f32[2] {")
    m2 = parse_and_verify(text)
    assert m2.entry == "main" and set(m2.computations) == set(m.computations)


def test_typed_attrs_round_trip() -> None:
    win = Window((WindowDim(3, 2, 1, -1, 1, 2, True), WindowDim(1, 1, 0, 0, 3, 1, False)))
    cd = ConvDims(3, 0, (1, 2), 1, 0, (2, 3), 0, 1, (2, 3))  # no text: printed from the roles
    assert format_dim_labels(cd) == "f01b_oi01->bf01"
    conv = Instruction("r", Op.CONVOLUTION, ArrayShape(DType.F32, (2, 5, 6, 7)), ("x", "k"),
                       make_attrs({"window": win, "dim_labels": cd, "feature_group_count": 2}))
    sl = Instruction("s", Op.SLICE, ArrayShape(DType.F32, (2,)), ("x",), make_attrs({"slice": ((1, 7, 3),)}))
    pad = Instruction("t", Op.PAD, ArrayShape(DType.F32, (9,)), ("x", "z"), make_attrs({"padding": ((-1, 2, 1),)}))
    for inst in (conv, sl, pad):
        text = f"HloModule m\nENTRY e {{\n  ROOT {print_instruction(inst)}\n}}\n"
        got = parse_hlo(text).entry_computation.root_instruction
        if inst is conv:
            assert got.attr("window") == win and got.attr("dim_labels").input_spatial == (1, 2)
            assert got.attr("dim_labels") == ConvDims(*[getattr(cd, f) for f in (
                "input_batch", "input_feature", "input_spatial", "kernel_input_feature", "kernel_output_feature",
                "kernel_spatial", "output_batch", "output_feature", "output_spatial")], "f01b_oi01->bf01")
        else:
            assert got == inst


_FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                     elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True))


@settings(max_examples=150, deadline=None)
@given(_FLOATS)
def test_float_literal_round_trip(arr: np.ndarray) -> None:
    shape = ArrayShape(DType.F32, arr.shape)
    text = format_literal(arr, DType.F32)
    back = parse_literal(text, shape)
    assert back.dtype == np.float32 and back.shape == arr.shape
    nan = np.isnan(arr)
    assert (np.isnan(back) == nan).all()
    assert (back[~nan].view(np.uint32) == arr[~nan].view(np.uint32)).all()  # bit exact, -0 included
    assert format_literal(back, DType.F32) == text


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([DType.S8, DType.S32, DType.S64, DType.U8, DType.U32, DType.PRED, DType.F64, DType.F16]),
       st.data())
def test_other_literal_round_trip(dtype: DType, data) -> None:
    elements = st.booleans() if dtype is DType.PRED else None
    arr = data.draw(hnp.arrays(dtype.np, hnp.array_shapes(min_dims=0, max_dims=2, max_side=5), elements=elements))
    back = parse_literal(format_literal(arr, dtype), ArrayShape(dtype, arr.shape))
    np.testing.assert_array_equal(back, arr)
    assert back.dtype == dtype.np
