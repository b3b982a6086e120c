"""The HLO text parser: every fixture text, typed attributes, and errors on malformed input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hlotune.errors import ParseError, ShapeError, UnsupportedError
from hlotune.ir.hlo import ArrayShape, ConvDims, DType, Op, TupleShape, Window, WindowDim, literal_array
from hlotune.ir.parser import load_hlo, parse_and_verify, parse_hlo

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
MANIFEST = json.loads((DATA / "manifest.json").read_text())["models"]
KINDS = {"hlo": "hlo_opcodes", "opt.hlo": "opt_hlo_opcodes", "bench.hlo": None,
         "bench.opt.hlo": "bench_opt_hlo_opcodes", "bench.gpu.opt.hlo": None}
FIXTURES = [(name, kind) for name in sorted(MANIFEST) for kind in KINDS]
_INST_LINE = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+) = ")


def fixture_path(name: str, kind: str) -> Path:
    return DATA / name / f"{name}.{kind}"


@pytest.mark.parametrize("name,kind", FIXTURES, ids=[f"{n}.{k}" for n, k in FIXTURES])
def test_fixture_parses(name: str, kind: str) -> None:
    path = fixture_path(name, kind)
    text = path.read_text()
    m = load_hlo(path)
    # reference: the instruction lines of the text, found by a plain regex
    want = [(k + 1, mm.group(2)) for k, line in enumerate(text.split("\n")) if (mm := _INST_LINE.match(line))]
    got = [(i.line, i.name) for c in m.computations for i in c.instructions]
    assert got == want
    roots = [mm.group(2) for line in text.split("\n") if (mm := _INST_LINE.match(line)) and mm.group(1)]
    assert [c.root for c in m.computations] == roots
    entry = re.search(r"^ENTRY %?([\w.\-]+)", text, re.M).group(1)
    assert m.entry == entry and m.entry_computation.is_entry
    assert m.name == re.match(r"HloModule ([\w.\-]+)", text).group(1)
    key = KINDS[kind]
    if key:  # the opcodes the manifest lists
        assert sorted({i.op.value for c in m.computations for i in c.instructions}) == sorted(MANIFEST[name][key])
    if kind in ("hlo", "opt.hlo"):  # entry parameters = the test inputs of the manifest
        params = m.entry_computation.parameters
        assert [p.shape.dims for p in params] == [tuple(x["shape"]) for x in MANIFEST[name]["test"]["inputs"]]
        assert all(p.shape.dtype is DType.F32 for p in params)


def test_fixture_parameters_match_npz() -> None:
    for name in MANIFEST:
        m = load_hlo(fixture_path(name, "hlo"))
        npz = np.load(DATA / name / f"{name}.npz")
        shapes = [p.shape.dims for p in m.entry_computation.parameters]
        assert shapes == [npz[f"arg{k}"].shape for k in range(len(shapes))]


def test_header_and_sections() -> None:
    m = load_hlo(fixture_path("conv2d_bias_relu", "opt.hlo"))
    attrs = dict(m.attrs)
    assert [k for k, _ in m.attrs] == ["is_scheduled", "entry_computation_layout",
                                      "allow_spmd_sharding_propagation_to_parameters",
                                      "allow_spmd_sharding_propagation_to_output"]
    assert attrs["is_scheduled"] == "true"
    assert attrs["entry_computation_layout"] == ("{(f32[1,8,8,4]{3,2,1,0}, f32[3,3,4,8]{3,2,1,0}, f32[8]{0})"
                                                 "->f32[1,8,8,8]{3,2,1,0}}")
    assert [c.name for c in m.computations] == ["fused_computation", "main.2"]
    conv = m.entry_computation["conv_general_dilated.1"]
    assert conv.op is Op.CONVOLUTION and conv.operands == ("x.1", "w.1")
    assert conv.shape == ArrayShape(DType.F32, (1, 8, 8, 8), (3, 2, 1, 0))
    assert conv.attr("window") == Window((WindowDim(size=3, pad_lo=1, pad_hi=1),) * 2)
    assert conv.attr("dim_labels") == ConvDims(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2), "b01f_01io->b01f")
    assert conv.attr("metadata") == '{op_name="jit(conv2d_bias_relu)/conv_general_dilated" stack_frame_id=4}'
    fusion = m.entry_computation.root_instruction
    assert (fusion.attr("kind"), fusion.attr("calls"), fusion.called) == ("kLoop", "fused_computation",
                                                                          ("fused_computation",))


def test_gpu_custom_call_and_backend_config() -> None:
    path = fixture_path("conv2d_bias_relu", "bench.gpu.opt.hlo")
    text = path.read_text()
    m = load_hlo(path)
    cc = m.entry_computation["cudnn-conv-bias-activation.3"]
    assert cc.op is Op.CUSTOM_CALL
    assert cc.attr("custom_call_target") == "__cudnn$convBiasActivationForward"
    assert cc.shape == TupleShape((ArrayShape(DType.F32, (8, 56, 56, 64), (3, 2, 1, 0)),
                                   ArrayShape(DType.U8, (12992528,), (0,))))
    assert cc.attr("dim_labels").kernel_output_feature == 0  # b01f_o01i->b01f
    assert cc.attr("dim_labels").kernel_input_feature == 3
    line = text.split("\n")[cc.line - 1]
    assert line.endswith("backend_config=" + cc.attr("backend_config"))  # verbatim, nested braces and quotes
    assert cc.attr("operand_precision") == "{highest,highest,default}"
    gte = m.entry_computation.root_instruction
    assert gte.op is Op.GET_TUPLE_ELEMENT and gte.attr("index") == 0


def test_slice_pad_reduce_window_attrs() -> None:
    m = load_hlo(fixture_path("transformer_block", "bench.gpu.opt.hlo"))
    slices = {i.attr("slice") for c in m.computations for i in c.instructions if i.op is Op.SLICE}
    assert ((0, 32, 1), (0, 128, 1), (512, 1024, 1)) in slices
    m = load_hlo(fixture_path("mlp_train_step", "bench.gpu.opt.hlo"))
    pads = {i.attr("padding") for c in m.computations for i in c.instructions if i.op is Op.PAD}
    assert pads <= {((0, 16, 0), (0, 0, 0)), ((0, 0, 0), (0, 16, 0))} and pads
    m = load_hlo(fixture_path("mlp_train_step", "bench.opt.hlo"))
    wins = [i.attr("window") for c in m.computations for i in c.instructions if i.op is Op.REDUCE_WINDOW]
    assert {(w.field("size"), w.field("stride")) for w in wins} == {((32, 1), (32, 1)), ((32, 10), (32, 10))}


def test_constants_and_literals() -> None:
    m = load_hlo(fixture_path("softmax", "hlo"))
    consts = [i for c in m.computations for i in c.instructions if i.op is Op.CONSTANT]
    assert {i.attr("literal") for i in consts} >= {"-inf"}
    text = """HloModule m
ENTRY e {
  a = f32[2,2]{1,0} constant({ { 1, 2.5 }, { -inf, nan } })
  b = pred[3] constant({true, false, true})
  c = s32[] constant(-7)
  d = f32[] constant(1e-05)
  e = f32[] constant(0.0441941731)
  ROOT t = (f32[2,2], pred[3], s32[], f32[], f32[]) tuple(a, b, c, d, e)
}
"""
    m = parse_hlo(text)
    e = m.entry_computation
    a = literal_array(e["a"])
    assert a.dtype == np.float32 and a[0].tolist() == [1.0, 2.5] and a[1, 0] == -np.inf and np.isnan(a[1, 1])
    assert e["a"].attr("literal") == "{ {1, 2.5}, {-inf, nan} }"
    assert literal_array(e["b"]).tolist() == [True, False, True]
    assert literal_array(e["c"]) == -7 and e["c"].attr("literal") == "-7"
    assert literal_array(e["d"]) == np.float32(1e-05) and e["d"].attr("literal") == "1e-05"
    assert literal_array(e["e"]) == np.float32(0.0441941731)


def test_syntax_variants() -> None:
    text = """// a comment
HloModule m, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %main (p: f32[8,128]) -> (f32[8], f32[8,128]) {
  %p = f32[8,128]{1,0:T(8,128)S(1)} parameter(0)
  %z = f32[] constant(0)
  %r = f32[8]{0} reduce(%p, %z), dimensions={1}, to_apply=%add
  ROOT %t = (f32[8]{0}, /*index=1*/f32[8,128]{1,0}) tuple(%r, %p)
}
"""
    m = parse_and_verify(text)
    assert m.attrs == (("is_scheduled", "true"),)
    p = m.entry_computation["p"]
    assert p.shape.layout == (1, 0) and p.attr("parameter_number") == 0 and p.line == 11
    assert m.computation("add")["s"].operands == ("x", "y")
    assert m.entry_computation["r"].attr("to_apply") == "add"


def test_no_entry_or_root_takes_last() -> None:
    m = parse_hlo("HloModule m\nc {\n a = f32[] parameter(0)\n b = f32[] negate(a)\n}\n")
    assert m.entry == "c" and m.entry_computation.root == "b" and m.entry_computation.is_entry


def test_errors_name_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.hlo"
    f.write_text("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] frobnicate(a)\n}\n")
    with pytest.raises(UnsupportedError) as ei:
        load_hlo(f)
    assert ei.value.file == str(f) and ei.value.line == 4 and "frobnicate" in str(ei.value)
    assert str(f) in str(ei.value)
    with pytest.raises(ParseError):
        load_hlo(tmp_path / "missing.hlo")


_GOOD = "HloModule m\nENTRY e {\n  a = f32[2]{0} parameter(0)\n  ROOT b = f32[2]{0} negate(a)\n}\n"

# (replace this, by that) in _GOOD -> error class, line, column, text the message must hold
MALFORMED = [
    (("negate(a)", "frob(a)"), UnsupportedError, 4, 22, "frob"),
    (("f32[2]{0} parameter", "f31[2]{0} parameter"), UnsupportedError, 3, 7, "f31"),
    (("f32[2]{0} parameter", "u64[2]{0} parameter"), UnsupportedError, 3, 7, "u64"),
    (("f32[2]{0} neg", "f32[2{0} neg"), ParseError, 4, 12, "shape"),
    (("f32[2]{0} neg", "f32[x]{0} neg"), ParseError, 4, 12, "'x'"),
    (("f32[2]{0} neg", "f32[<=2]{0} neg"), UnsupportedError, 4, 12, "<=2"),
    (("ROOT b = ", "ROOT b "), ParseError, 4, 10, "'='"),
    (("negate(a)", "negate(a"), ParseError, 4, 30, "')'"),
    (("negate(a)", "negate(a), dimensions={1,x}"), ParseError, 4, 47, "'x}'"),
    (("negate(a)", "negate(a), dimensions=[1]"), ParseError, 4, 44, "'{'"),
    (("negate(a)", "negate(a), wibble=3"), UnsupportedError, 4, 32, "wibble"),
    (("negate(a)", "negate(a), metadata={op_name=\"x}"), ParseError, 4, 51, "unterminated"),
    (("negate(a)", "negate(a), metadata={op_name=1"), ParseError, 4, 42, "unbalanced"),
    (("negate(a)", "negate(a) junk"), ParseError, 4, 32, "'junk'"),
    (("parameter(0)", "parameter(x)"), ParseError, 3, 27, "integer"),
    (("HloModule m", "HloModul m"), ParseError, 1, 1, "HloModule"),
    (("  ROOT b", "  ROOT b = f32[2]{0} negate(a)\n  ROOT c"), ParseError, 5, None, "second ROOT"),
    (("  ROOT b", "  a"), ParseError, 4, None, "duplicate"),
    (("\n}\n", "\n"), ParseError, 2, None, "not closed"),
    (("negate(a)", "negate(a), window={size=3x3 stride=1}"), ParseError, 4, 40, "different numbers"),
    (("negate(a)", "negate(a), dim_labels=b01f_01io->b0f"), ParseError, 4, 44, "dim_labels"),
    (("negate(a)", "negate(a), padding=0_0_0_0"), ParseError, 4, 41, "padding"),
    (("negate(a)", "negate(a), slice={[0:2}"), ParseError, 4, 44, "']'"),
    (("parameter(0)", "constant({1, 2, 3})"), ShapeError, 3, 26, "3 elements"),
    (("parameter(0)", "constant({1, zz})"), ParseError, 3, 26, "zz"),
    (("f32[2]{0} parameter(0)", "(f32[2], token[]) parameter(0)"), UnsupportedError, 3, 16, "token"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0][1][:30] for c in MALFORMED])
def test_malformed(case) -> None:
    (old, new), cls, line, column, needle = case
    assert old in _GOOD
    text = _GOOD.replace(old, new, 1)
    with pytest.raises(cls) as ei:
        parse_hlo(text, file="t.hlo")
    err = ei.value
    assert err.line == line, str(err)
    if column is not None:
        assert err.column == column, str(err)
        assert f"line {line}, column {column}" in str(err)
    assert needle in str(err)
    assert str(err).startswith("t.hlo")


def test_good_text_parses() -> None:
    m = parse_hlo(_GOOD)
    assert [i.op for i in m.entry_computation] == [Op.PARAMETER, Op.NEGATE]


def test_large_text_is_fast() -> None:
    import time
    lines = ["HloModule big", "ENTRY main {", "  p0 = f32[128,256]{1,0} parameter(0)"]
    prev = "p0"
    for k in range(8000):
        lines.append(f"  add.{k} = f32[128,256]{{1,0}} add({prev}, p0), "
                     f"metadata={{op_name=\"jit(f)/add\" source_file=\"some/file.py\" source_line={k}}}")
        prev = f"add.{k}"
    lines += [f"  ROOT r = f32[128,256]{{1,0}} negate({prev})", "}"]
    text = "\n".join(lines)
    assert len(text) > 900_000
    t = time.perf_counter()
    m = parse_hlo(text)
    assert time.perf_counter() - t < 2.0
    assert len(m.entry_computation.instructions) == 8002
