"""Shape inference and verification: fixtures, one snippet per opcode, numpy-derived shapes, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from hlotune.errors import ShapeError
from hlotune.ir.hlo import ArrayShape, Computation, DType, Op, TupleShape
from hlotune.ir.parser import load_hlo, parse_and_verify, parse_hlo
from hlotune.ir.verify import infer_shape, verify_module

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
FIXTURE_FILES = sorted(DATA.glob("*/*.hlo"))

ADD = "add_c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
ADD2 = ("add2 {\n  a = f32[] parameter(0)\n  b = s32[] parameter(1)\n  c = f32[] parameter(2)\n"
        "  d = s32[] parameter(3)\n  x = f32[] add(a, c)\n  y = s32[] add(b, d)\n"
        "  ROOT t = (f32[], s32[]) tuple(x, y)\n}\n")
FC = "fc {\n  a = f32[2,3] parameter(0)\n  ROOT n = f32[2,3] negate(a)\n}\n"


def mod(body: str, comps: str = "") -> str:
    return f"HloModule m\n\n{comps}\nENTRY e {{\n{body}\n}}\n"


def un(op: str, dt: str = "f32", out: str | None = None) -> str:
    return mod(f"  p = {dt}[2,3] parameter(0)\n  ROOT r = {out or dt}[2,3] {op}(p)")


def bin_(op: str, dt: str = "f32") -> str:
    return mod(f"  p = {dt}[2,3] parameter(0)\n  q = {dt}[2,3] parameter(1)\n  ROOT r = {dt}[2,3] {op}(p, q)")


SNIPPETS: dict[Op, str] = {
    **{op: un(op.value) for op in (Op.ABS, Op.CEIL, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.FLOOR, Op.LOG,
                                   Op.LOG1P, Op.LOGISTIC, Op.NEGATE, Op.ROUND_NEAREST_EVEN, Op.RSQRT, Op.SIGN,
                                   Op.SINE, Op.SQRT, Op.TANH, Op.COPY)},
    Op.IS_FINITE: un("is-finite", "f32", "pred"),
    Op.NOT: un("not", "pred"),
    **{op: bin_(op.value) for op in (Op.ADD, Op.ATAN2, Op.DIVIDE, Op.MAXIMUM, Op.MINIMUM, Op.MULTIPLY, Op.POWER,
                                     Op.REMAINDER, Op.SUBTRACT)},
    **{op: bin_(op.value, "s32") for op in (Op.AND, Op.OR, Op.XOR)},
    Op.COMPARE: mod("  p = f32[2,3] parameter(0)\n  q = f32[2,3] parameter(1)\n"
                    "  ROOT r = pred[2,3] compare(p, q), direction=LT"),
    Op.SELECT: mod("  c = pred[2,3] parameter(0)\n  p = f32[2,3] parameter(1)\n  q = f32[2,3] parameter(2)\n"
                   "  ROOT r = f32[2,3] select(c, p, q)"),
    Op.CLAMP: mod("  lo = f32[] parameter(0)\n  x = f32[2,3] parameter(1)\n  hi = f32[] parameter(2)\n"
                  "  ROOT r = f32[2,3] clamp(lo, x, hi)"),
    Op.CONVERT: un("convert", "f32", "s32"),
    Op.BITCAST: mod("  p = f32[2,3]{1,0} parameter(0)\n  ROOT r = f32[6]{0} bitcast(p)"),
    Op.BROADCAST: mod("  p = f32[3] parameter(0)\n  ROOT r = f32[2,3] broadcast(p), dimensions={1}"),
    Op.CALL: mod("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] call(p), to_apply=fc", FC),
    Op.FUSION: mod("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] fusion(p), kind=kLoop, calls=fc", FC),
    Op.CONCATENATE: mod("  p = f32[2,3] parameter(0)\n  q = f32[2,5] parameter(1)\n"
                        "  ROOT r = f32[2,8] concatenate(p, q), dimensions={1}"),
    Op.CONSTANT: mod("  ROOT r = f32[2,2] constant({ {1, 2}, {3, 4} })"),
    Op.CONVOLUTION: mod("  x = f32[1,8,8,4] parameter(0)\n  w = f32[3,3,4,8] parameter(1)\n"
                        "  ROOT r = f32[1,4,4,8] convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x1_1}, "
                        "dim_labels=b01f_01io->b01f"),
    Op.CUSTOM_CALL: mod("  p = f32[2,3] parameter(0)\n"
                        "  ROOT r = (f32[2,3], u8[16]{0}) custom-call(p), custom_call_target=\"foo\", "
                        "backend_config={\"a\":{\"b\":\"x}\\\"y\"}}"),
    Op.DOT: mod("  a = f32[4,2,3] parameter(0)\n  b = f32[4,3,5] parameter(1)\n"
                "  ROOT r = f32[4,2,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
                "rhs_batch_dims={0}, rhs_contracting_dims={1}"),
    Op.DYNAMIC_SLICE: mod("  p = f32[5,6] parameter(0)\n  i = s32[] parameter(1)\n  j = s32[] parameter(2)\n"
                          "  ROOT r = f32[2,3] dynamic-slice(p, i, j), dynamic_slice_sizes={2,3}"),
    Op.DYNAMIC_UPDATE_SLICE: mod("  p = f32[5,6] parameter(0)\n  u = f32[2,3] parameter(1)\n"
                                 "  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n"
                                 "  ROOT r = f32[5,6] dynamic-update-slice(p, u, i, j)"),
    Op.GATHER: mod("  p = f32[5,3] parameter(0)\n  i = s32[4,1] parameter(1)\n"
                   "  ROOT r = f32[4,3] gather(p, i), offset_dims={1}, collapsed_slice_dims={0}, "
                   "start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}, indices_are_sorted=false"),
    Op.GET_TUPLE_ELEMENT: mod("  p = (f32[2], s32[]) parameter(0)\n  ROOT r = s32[] get-tuple-element(p), index=1"),
    Op.IOTA: mod("  ROOT r = s32[4,5] iota(), iota_dimension=1"),
    Op.PAD: mod("  p = f32[3,4] parameter(0)\n  z = f32[] constant(0)\n"
                "  ROOT r = f32[8,3] pad(p, z), padding=1_2_1x-1_0"),
    Op.PARAMETER: mod("  ROOT p = f32[2,3] parameter(0)"),
    Op.REDUCE: mod("  p = f32[2,3] parameter(0)\n  z = f32[] constant(0)\n"
                   "  ROOT r = f32[3] reduce(p, z), dimensions={0}, to_apply=add_c", ADD),
    Op.REDUCE_WINDOW: mod("  p = f32[4,6] parameter(0)\n  z = f32[] constant(0)\n"
                          "  ROOT r = f32[2,2] reduce-window(p, z), window={size=2x3 stride=2x3}, to_apply=add_c", ADD),
    Op.RESHAPE: mod("  p = f32[2,3] parameter(0)\n  ROOT r = f32[3,2] reshape(p)"),
    Op.REVERSE: mod("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] reverse(p), dimensions={0,1}"),
    Op.SLICE: mod("  p = f32[5,6] parameter(0)\n  ROOT r = f32[2,2] slice(p), slice={[1:5:2], [0:6:3]}"),
    Op.TRANSPOSE: mod("  p = f32[2,3,4] parameter(0)\n  ROOT r = f32[4,2,3] transpose(p), dimensions={2,0,1}"),
    Op.TUPLE: mod("  p = f32[2,3] parameter(0)\n  q = s32[] parameter(1)\n  ROOT r = (f32[2,3], s32[]) tuple(p, q)"),
}
TRUSTED = {Op.PARAMETER, Op.IOTA, Op.CUSTOM_CALL}  # the declared shape is the shape


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.name for p in FIXTURE_FILES])
def test_fixture_verifies(path: Path) -> None:
    m = verify_module(load_hlo(path))
    for c in m.computations:  # every inferred shape equals the declared one (layouts dropped)
        for i in c.instructions:
            got = infer_shape(i, tuple(c[o].shape for o in i.operands), m)
            assert got == _strip(i.shape), i.name


def _strip(s):
    return TupleShape(tuple(_strip(e) for e in s.elements)) if isinstance(s, TupleShape) else \
        ArrayShape(s.dtype, s.dims)


def test_every_op_has_a_snippet() -> None:
    assert set(SNIPPETS) == set(Op)


@pytest.mark.parametrize("op", list(SNIPPETS), ids=[o.value for o in SNIPPETS])
def test_op_snippet(op: Op) -> None:
    m = parse_and_verify(SNIPPETS[op])
    root = m.entry_computation.root_instruction
    assert root.op is op
    if op in TRUSTED:
        return
    # the same module with a wrong declared root shape must be refused, naming the root and its line
    bad = _grow(root.shape)
    e = m.entry_computation
    insts = tuple(i.replace(shape=bad) if i.name == root.name else i for i in e.instructions)
    m2 = m.with_computations(tuple(Computation(c.name, insts, c.root, True, c.line) if c.is_entry else c
                                   for c in m.computations))
    with pytest.raises(ShapeError) as ei:
        verify_module(m2)
    assert ei.value.op == root.name and ei.value.line == root.line


def _grow(s):
    if isinstance(s, TupleShape):
        return TupleShape((_grow(s.elements[0]),) + s.elements[1:])
    return ArrayShape(s.dtype, s.dims[:-1] + (s.dims[-1] + 1,) if s.dims else (1,))


def _root_dims(text: str) -> tuple[int, ...]:
    m = parse_hlo(text)
    e = m.entry_computation
    r = e.root_instruction
    return infer_shape(r, tuple(e[o].shape for o in r.operands), m).dims


def _shape_text(dims) -> str:
    return ",".join(map(str, dims))


@pytest.mark.parametrize("stride,pad,dil,lhs_dil,groups", [
    (1, (1, 1), 1, 1, 1), (2, (0, 0), 1, 1, 1), (3, (2, 1), 2, 1, 1), (1, (0, 0), 1, 2, 1), (2, (1, 0), 1, 1, 2),
])
def test_convolution_shape_matches_numpy(stride, pad, dil, lhs_dil, groups) -> None:
    n, h, w, cin, k, cout = 2, 11, 9, 4, 3, 6
    x = np.zeros((n, h, w, cin))
    # reference: dilate the input, pad it, take dilated windows with numpy, stride over them
    xd = np.zeros((n, (h - 1) * lhs_dil + 1, (w - 1) * lhs_dil + 1, cin))
    xd[:, ::lhs_dil, ::lhs_dil] = x
    xp = np.pad(xd, ((0, 0), pad, pad, (0, 0)))
    span = (k - 1) * dil + 1
    win = sliding_window_view(xp, (span, span), axis=(1, 2))[:, ::stride, ::stride]
    oh, ow = win.shape[1], win.shape[2]
    text = mod(f"  x = f32[{n},{h},{w},{cin}] parameter(0)\n  k = f32[{k},{k},{cin // groups},{cout}] parameter(1)\n"
               f"  ROOT r = f32[{n},{oh},{ow},{cout}] convolution(x, k), window={{size={k}x{k} stride={stride}x{stride}"
               f" pad={pad[0]}_{pad[1]}x{pad[0]}_{pad[1]} lhs_dilate={lhs_dil}x{lhs_dil} rhs_dilate={dil}x{dil}}}, "
               f"dim_labels=b01f_01io->b01f, feature_group_count={groups}")
    assert _root_dims(text) == (n, oh, ow, cout)
    parse_and_verify(text)


def test_convolution_layouts_and_batch_groups() -> None:
    # NCHW input, OIHW kernel, NCHW output; batch_group_count divides the batch
    text = mod("  x = f32[4,3,7,7] parameter(0)\n  k = f32[6,3,3,3] parameter(1)\n"
               "  ROOT r = f32[2,6,5,5] convolution(x, k), window={size=3x3}, dim_labels=bf01_oi01->bf01, "
               "batch_group_count=2")
    assert _root_dims(text) == (2, 6, 5, 5)
    parse_and_verify(text)


@pytest.mark.parametrize("lb,lc,rb,rc,a,b,spec", [
    ((), (1,), (), (0,), (3, 4), (4, 5), "ij,jk->ik"),
    ((0,), (2,), (0,), (1,), (2, 3, 4), (2, 4, 5), "bij,bjk->bik"),
    ((), (0,), (), (1,), (4, 3), (5, 4), "ji,kj->ik"),
    ((1,), (0,), (2,), (0,), (4, 2, 3), (4, 5, 2), "jbi,jkb->bik"),
    ((), (), (), (), (2,), (3,), "i,j->ij"),
])
def test_dot_shape_matches_einsum(lb, lc, rb, rc, a, b, spec) -> None:
    want = np.einsum(spec, np.zeros(a), np.zeros(b)).shape
    t = lambda d: "{" + ",".join(map(str, d)) + "}"
    text = mod(f"  a = f32[{_shape_text(a)}] parameter(0)\n  b = f32[{_shape_text(b)}] parameter(1)\n"
               f"  ROOT r = f32[{_shape_text(want)}] dot(a, b), lhs_batch_dims={t(lb)}, lhs_contracting_dims={t(lc)}, "
               f"rhs_batch_dims={t(rb)}, rhs_contracting_dims={t(rc)}")
    assert _root_dims(text) == want
    parse_and_verify(text)


@pytest.mark.parametrize("cfg", [((1, 2, 1), (-1, 0, 0)), ((0, 0, 2), (3, -2, 1)), ((-1, -1, 0), (0, 0, 0))])
def test_pad_shape_matches_numpy(cfg) -> None:
    x = np.zeros((3, 4))
    ref = x
    for axis, (lo, hi, it) in enumerate(cfg):  # interior by scattering, then edges with np.pad / slicing
        n = ref.shape[axis]
        shape = list(ref.shape)
        shape[axis] = n + max(n - 1, 0) * it
        d = np.zeros(shape)
        idx = [slice(None)] * ref.ndim
        idx[axis] = slice(None, None, it + 1)
        d[tuple(idx)] = ref
        widths = [(0, 0)] * ref.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        d = np.pad(d, widths)
        idx = [slice(None)] * ref.ndim
        idx[axis] = slice(-min(lo, 0), d.shape[axis] + min(hi, 0))
        ref = d[tuple(idx)]
    padding = "x".join(f"{lo}_{hi}_{it}" for lo, hi, it in cfg)
    text = mod(f"  p = f32[3,4] parameter(0)\n  z = f32[] constant(0)\n"
               f"  ROOT r = f32[{_shape_text(ref.shape)}] pad(p, z), padding={padding}")
    assert _root_dims(text) == ref.shape
    parse_and_verify(text)


@pytest.mark.parametrize("sl", [((1, 5, 2), (0, 6, 3)), ((0, 0, 1), (2, 6, 1)), ((4, 5, 1), (5, 6, 4))])
def test_slice_shape_matches_numpy(sl) -> None:
    want = np.zeros((5, 6))[tuple(slice(*s) for s in sl)].shape
    text = mod(f"  p = f32[5,6] parameter(0)\n  ROOT r = f32[{_shape_text(want)}] slice(p), "
               "slice={" + ", ".join(f"[{a}:{b}:{c}]" for a, b, c in sl) + "}")
    assert _root_dims(text) == want
    parse_and_verify(text)


@pytest.mark.parametrize("size,stride,pad", [((2, 3), (2, 3), ((0, 0), (0, 0))), ((3, 3), (1, 2), ((1, 1), (0, 2)))])
def test_reduce_window_shape_matches_numpy(size, stride, pad) -> None:
    xp = np.pad(np.zeros((7, 6)), pad)
    want = sliding_window_view(xp, size)[::stride[0], ::stride[1]].shape[:2]
    text = mod(f"  p = f32[7,6] parameter(0)\n  z = f32[] constant(0)\n  ROOT r = f32[{_shape_text(want)}] "
               f"reduce-window(p, z), window={{size={size[0]}x{size[1]} stride={stride[0]}x{stride[1]} "
               f"pad={pad[0][0]}_{pad[0][1]}x{pad[1][0]}_{pad[1][1]}}}, to_apply=add_c", ADD)
    assert _root_dims(text) == want
    parse_and_verify(text)


def test_gather_like_numpy_indexing() -> None:
    x = np.zeros((5, 3, 7))
    idx = np.zeros((2, 4), dtype=np.int32)
    want = x[idx].shape  # (2, 4, 3, 7): JAX's x[idx] gather
    text = mod("  p = f32[5,3,7] parameter(0)\n  i = s32[2,4,1] parameter(1)\n"
               f"  ROOT r = f32[{_shape_text(want)}] gather(p, i), offset_dims={{2,3}}, collapsed_slice_dims={{0}}, "
               "start_index_map={0}, index_vector_dim=2, slice_sizes={1,3,7}")
    assert _root_dims(text) == want
    parse_and_verify(text)


def test_variadic_reduce_gives_tuple() -> None:
    text = mod("  p = f32[2,3] parameter(0)\n  q = s32[2,3] parameter(1)\n  z = f32[] constant(0)\n"
               "  y = s32[] constant(0)\n  ROOT r = (f32[2], s32[2]) reduce(p, q, z, y), dimensions={1}, to_apply=add2",
               ADD2)
    m = parse_and_verify(text)
    assert m.entry_computation.root_instruction.shape == TupleShape((ArrayShape(DType.F32, (2,)),
                                                                     ArrayShape(DType.S32, (2,))))


BAD = [
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] add(p, q)\n  q = f32[2,3] parameter(1)", "r", "before use"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] add(p, zz)", "r", "'zz'"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] call(p), to_apply=nope", "r", "'nope'"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] negate(p, p)", "r", "takes 1 operands, got 2"),
    ("  p = f32[2,3] parameter(0)\n  q = f32[3,2] parameter(1)\n  ROOT r = f32[2,3] add(p, q)", "r", "f32[3,2]"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[3,2] negate(p)", "r",
     "declared shape f32[3,2] but inferred f32[2,3]"),
    ("  p = s32[2,3] parameter(0)\n  ROOT r = s32[2,3] exponential(p)", "r", "floating-point"),
    ("  p = f32[3] parameter(0)\n  ROOT r = f32[2,3] broadcast(p), dimensions={2}", "r", "out of range"),
    ("  p = f32[3] parameter(0)\n  ROOT r = f32[2,3] broadcast(p), dimensions={0}", "r", "maps to result"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[4] reshape(p)", "r", "6 elements"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[3,2] transpose(p), dimensions={0,0}", "r", "repeats"),
    ("  a = f32[2,3] parameter(0)\n  b = f32[4,5] parameter(1)\n  ROOT r = f32[2,5] dot(a, b), "
     "lhs_contracting_dims={1}, rhs_contracting_dims={0}", "r", "contracting dimension"),
    ("  x = f32[1,8,8,4] parameter(0)\n  w = f32[3,3,5,8] parameter(1)\n  ROOT r = f32[1,8,8,8] "
     "convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f", "r", "input features"),
    ("  p = f32[5,6] parameter(0)\n  ROOT r = f32[2,2] slice(p), slice={[1:7], [0:2]}", "r", "does not fit"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2] get-tuple-element(p), index=0", "r", "tuple"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = pred[2,3] compare(p, p), direction=XX", "r", "direction"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] broadcast(p)", "r", "missing attribute 'dimensions'"),
    ("  p = f32[2,3] parameter(0)\n  z = s32[] constant(0)\n  ROOT r = f32[3] reduce(p, z), dimensions={0}, "
     "to_apply=add_c", "r", "init value"),
    ("  p = f32[2,3] parameter(0)\n  ROOT r = s32[2,3] fusion(p), kind=kLoop, calls=fc", "r", "inferred f32[2,3]"),
]


@pytest.mark.parametrize("body,name,needle", BAD, ids=[b[2] for b in BAD])
def test_bad_module(body: str, name: str, needle: str) -> None:
    text = mod(body, ADD + "\n" + FC)
    m = parse_hlo(text, file="x.hlo")
    with pytest.raises(ShapeError) as ei:
        verify_module(m)
    err = ei.value
    assert err.op == name and needle in str(err)
    line = next(k + 1 for k, s in enumerate(text.split("\n")) if s.strip().startswith(("ROOT " + name + " ",
                                                                                        name + " ")))
    assert err.line == line and f"line {line}" in str(err)
    with pytest.raises(ShapeError) as ei:
        parse_and_verify(text, file="x.hlo")
    assert str(ei.value).startswith("x.hlo")


def test_parameter_numbers_and_cycles() -> None:
    with pytest.raises(ShapeError, match="parameter numbers"):
        parse_and_verify(mod("  p = f32[] parameter(0)\n  ROOT q = f32[] parameter(2)"))
    cyc = "c1 {\n  a = f32[] parameter(0)\n  ROOT b = f32[] call(a), to_apply=c2\n}\n" \
          "c2 {\n  a = f32[] parameter(0)\n  ROOT b = f32[] call(a), to_apply=c1\n}\n"
    with pytest.raises(ShapeError, match="calls itself"):
        parse_and_verify(mod("  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=c1", cyc))
