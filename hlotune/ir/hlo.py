"""The HLO data model: opcodes, dtypes, shapes, instructions, computations, modules.

Map:
  Op, DType            enums of supported opcodes and element types
  ELEMENTWISE, ...     op properties as sets (rule tables elsewhere are keyed by Op)
  ArrayShape/TupleShape frozen shapes; `Shape` is either
  Window, ConvDims      typed attribute values of convolution / reduce-window
  Instruction          one HLO instruction (frozen; `attrs` a sorted tuple of (key, value))
  Computation          a named list of instructions with a ROOT
  Module               computations + the entry name

Everything is a frozen dataclass with tuple children, so modules compare and hash
structurally; `line` fields (source positions) do not take part in equality.

Attribute values by key (what the parser produces and the printer expects):
  dimensions, lhs_contracting_dims, rhs_contracting_dims, lhs_batch_dims, rhs_batch_dims,
  dynamic_slice_sizes, slice_sizes, offset_dims, collapsed_slice_dims, start_index_map,
  operand_batching_dims, start_indices_batching_dims      -> tuple[int, ...]
  index, iota_dimension, index_vector_dim, feature_group_count, batch_group_count,
  parameter_number                                         -> int
  direction ("EQ", "NE", "LT", "LE", "GT", "GE"), type (compare type), kind (fusion kind),
  custom_call_target, literal (constant text, canonical), to_apply, calls  -> str
  slice    -> tuple[(start, limit, stride), ...]
  padding  -> tuple[(low, high, interior), ...]            (pad instruction)
  window   -> Window
  dim_labels -> ConvDims
  indices_are_sorted, unique_indices                       -> bool
  anything else (metadata, backend_config, frontend_attributes, sharding, ...) -> str,
  the raw text after `key=`, printed back verbatim ("opaque" attributes, OPAQUE_ATTRS).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np


class Op(str, enum.Enum):
    """Every HLO opcode hlotune understands (value = the text XLA prints)."""

    ABS = "abs"
    ADD = "add"
    AND = "and"
    ATAN2 = "atan2"
    BITCAST = "bitcast"
    BROADCAST = "broadcast"
    CALL = "call"
    CEIL = "ceil"
    CLAMP = "clamp"
    COMPARE = "compare"
    CONCATENATE = "concatenate"
    CONSTANT = "constant"
    CONVERT = "convert"
    CONVOLUTION = "convolution"
    COPY = "copy"
    COSINE = "cosine"
    CUSTOM_CALL = "custom-call"
    DIVIDE = "divide"
    DOT = "dot"
    DYNAMIC_SLICE = "dynamic-slice"
    DYNAMIC_UPDATE_SLICE = "dynamic-update-slice"
    ERF = "erf"
    EXP = "exponential"
    EXPM1 = "exponential-minus-one"
    FLOOR = "floor"
    FUSION = "fusion"
    GATHER = "gather"
    GET_TUPLE_ELEMENT = "get-tuple-element"
    IOTA = "iota"
    IS_FINITE = "is-finite"
    LOG = "log"
    LOG1P = "log-plus-one"
    LOGISTIC = "logistic"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    MULTIPLY = "multiply"
    NEGATE = "negate"
    NOT = "not"
    OR = "or"
    PAD = "pad"
    PARAMETER = "parameter"
    POWER = "power"
    REDUCE = "reduce"
    REDUCE_WINDOW = "reduce-window"
    REMAINDER = "remainder"
    RESHAPE = "reshape"
    REVERSE = "reverse"
    ROUND_NEAREST_EVEN = "round-nearest-even"
    RSQRT = "rsqrt"
    SELECT = "select"
    SIGN = "sign"
    SINE = "sine"
    SLICE = "slice"
    SQRT = "sqrt"
    SUBTRACT = "subtract"
    TANH = "tanh"
    TRANSPOSE = "transpose"
    TUPLE = "tuple"
    XOR = "xor"

    def __str__(self) -> str:  # prints as the HLO text
        return self.value


UNARY_MATH = frozenset({
    Op.ABS, Op.CEIL, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.FLOOR, Op.IS_FINITE, Op.LOG, Op.LOG1P,
    Op.LOGISTIC, Op.NEGATE, Op.NOT, Op.ROUND_NEAREST_EVEN, Op.RSQRT, Op.SIGN, Op.SINE, Op.SQRT, Op.TANH,
})
BINARY_MATH = frozenset({
    Op.ADD, Op.AND, Op.ATAN2, Op.DIVIDE, Op.MAXIMUM, Op.MINIMUM, Op.MULTIPLY, Op.OR, Op.POWER,
    Op.REMAINDER, Op.SUBTRACT, Op.XOR,
})
#: elementwise: output[i] depends only on operands[i] (same shapes)
ELEMENTWISE = UNARY_MATH | BINARY_MATH | {Op.COMPARE, Op.SELECT, Op.CLAMP, Op.CONVERT}
#: transcendental functions (costly per element, vectorized approximations in codegen)
TRANSCENDENTAL = frozenset({
    Op.ATAN2, Op.COSINE, Op.ERF, Op.EXP, Op.EXPM1, Op.LOG, Op.LOG1P, Op.LOGISTIC, Op.POWER,
    Op.RSQRT, Op.SINE, Op.SQRT, Op.TANH,
})
#: pure data movement: each output element is one input element (or a constant)
DATA_MOVEMENT = frozenset({
    Op.BITCAST, Op.BROADCAST, Op.CONCATENATE, Op.COPY, Op.DYNAMIC_SLICE, Op.DYNAMIC_UPDATE_SLICE,
    Op.GATHER, Op.IOTA, Op.PAD, Op.RESHAPE, Op.REVERSE, Op.SLICE, Op.TRANSPOSE,
})
#: ops with a reduction inside (reduce domain)
REDUCTION = frozenset({Op.REDUCE, Op.REDUCE_WINDOW, Op.DOT, Op.CONVOLUTION})
#: expensive producers never duplicated by fusion
EXPENSIVE = frozenset({Op.DOT, Op.CONVOLUTION, Op.REDUCE, Op.REDUCE_WINDOW, Op.CUSTOM_CALL})
#: ops that call other computations
CALLS = frozenset({Op.CALL, Op.FUSION, Op.REDUCE, Op.REDUCE_WINDOW, Op.CUSTOM_CALL})
#: structural ops that produce no new data
STRUCTURAL = frozenset({Op.PARAMETER, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.CONSTANT})
COMPARE_DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
#: custom-call targets read as a dot or a convolution
CUBLAS_TARGETS = frozenset({"__cublas$lt$matmul", "__cublas$gemm"})
CUDNN_CONV_TARGETS = frozenset({"__cudnn$convForward", "__cudnn$convBiasActivationForward"})


class DType(str, enum.Enum):
    """Element types (value = the text XLA prints)."""

    PRED = "pred"
    S8 = "s8"
    S32 = "s32"
    S64 = "s64"
    U8 = "u8"
    U32 = "u32"
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        """The numpy dtype used to hold values of this type (bf16 is held as float32)."""
        return np.dtype(_NP[self])

    @property
    def is_float(self) -> bool:
        return self in (DType.F16, DType.BF16, DType.F32, DType.F64)

    @property
    def is_int(self) -> bool:
        return self in (DType.S8, DType.S32, DType.S64, DType.U8, DType.U32)

    @property
    def is_signed(self) -> bool:
        return self in (DType.S8, DType.S32, DType.S64) or self.is_float

    @property
    def bits(self) -> int:
        return _BITS[self]


_NP = {DType.PRED: "bool", DType.S8: "int8", DType.S32: "int32", DType.S64: "int64", DType.U8: "uint8",
       DType.U32: "uint32", DType.F16: "float16", DType.BF16: "float32", DType.F32: "float32",
       DType.F64: "float64"}
_BITS = {DType.PRED: 8, DType.S8: 8, DType.S32: 32, DType.S64: 64, DType.U8: 8, DType.U32: 32,
         DType.F16: 16, DType.BF16: 16, DType.F32: 32, DType.F64: 64}
#: element types that appear only in XLA's optimized GPU text (workspaces); parsed, never computed
EXTRA_TYPE_NAMES = frozenset({"u64", "s16", "u16", "token"})


@dataclass(frozen=True)
class ArrayShape:
    """An array type: element type, dimensions, and layout (minor-to-major) when printed."""

    dtype: DType
    dims: tuple[int, ...]
    layout: tuple[int, ...] | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * max(1, self.dtype.bits // 8)

    def with_dtype(self, dtype: DType) -> ArrayShape:
        return ArrayShape(dtype, self.dims, self.layout)

    def is_tuple(self) -> bool:
        return False

    def __str__(self) -> str:
        s = f"{self.dtype.value}[{','.join(str(d) for d in self.dims)}]"
        if self.layout is not None:
            s += "{" + ",".join(str(d) for d in self.layout) + "}"
        return s


@dataclass(frozen=True)
class TupleShape:
    elements: tuple[Shape, ...]

    def is_tuple(self) -> bool:
        return True

    def flat(self) -> tuple[ArrayShape, ...]:
        out: list[ArrayShape] = []
        for e in self.elements:
            out.extend(e.flat() if isinstance(e, TupleShape) else (e,))
        return tuple(out)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.elements)

    def __str__(self) -> str:
        return "(" + ", ".join(str(e) for e in self.elements) + ")"


Shape = ArrayShape | TupleShape


def flat_shapes(shape: Shape) -> tuple[ArrayShape, ...]:
    """The array shapes of a (possibly nested) tuple shape, in order."""
    return shape.flat() if isinstance(shape, TupleShape) else (shape,)


@dataclass(frozen=True)
class WindowDim:
    size: int = 1
    stride: int = 1
    pad_lo: int = 0
    pad_hi: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1
    reversal: bool = False


@dataclass(frozen=True)
class Window:
    """`window={size=3x3 stride=1x1 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`."""

    dims: tuple[WindowDim, ...]

    def field(self, name: str) -> tuple:
        return tuple(getattr(d, name) for d in self.dims)


@dataclass(frozen=True)
class ConvDims:
    """`dim_labels=b01f_01io->b01f`: which dimension plays which role."""

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]
    text: str = ""


#: attributes kept as raw text, printed back verbatim, never interpreted
OPAQUE_ATTRS = frozenset({
    "metadata", "backend_config", "frontend_attributes", "sharding", "operand_precision",
    "precision_config", "api_version", "custom_call_has_side_effect", "output_to_operand_aliasing",
    "schedule", "statistics", "result_accuracy", "algorithm", "is_stable", "control-predecessors",
    "operand_layout_constraints", "origin", "raw_backend_config_string", "custom_call_schedule",
})


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction: `name = shape op(operands), attr=value, ...`.

    `operands` are names of instructions of the same computation; `attrs` is a tuple of
    (key, value) sorted by key (see the module docstring for value types); `line` is the
    1-based source line (not part of equality).
    """

    name: str
    op: Op
    shape: Shape
    operands: tuple[str, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    line: int | None = field(default=None, compare=False, hash=False)

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def has(self, key: str) -> bool:
        return any(k == key for k, _ in self.attrs)

    def with_attrs(self, **updates: Any) -> Instruction:
        """A copy with attributes set (value None removes the key)."""
        d = dict(self.attrs)
        for k, v in updates.items():
            if v is None:
                d.pop(k, None)
            else:
                d[k] = v
        return Instruction(self.name, self.op, self.shape, self.operands, make_attrs(d), self.line)

    def replace(self, **kw: Any) -> Instruction:
        from dataclasses import replace
        return replace(self, **kw)

    @property
    def called(self) -> tuple[str, ...]:
        """Names of computations this instruction calls."""
        out = []
        for key in ("to_apply", "calls"):
            v = self.attr(key)
            if v is not None:
                out.extend(v if isinstance(v, tuple) else (v,))
        return tuple(out)

    @property
    def array_shape(self) -> ArrayShape:
        assert isinstance(self.shape, ArrayShape), self.name
        return self.shape


def make_attrs(d: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes in canonical (sorted) order."""
    return tuple(sorted(d.items(), key=lambda kv: kv[0]))


@dataclass(frozen=True)
class Computation:
    """A named computation: instructions in definition order; `root` names the ROOT."""

    name: str
    instructions: tuple[Instruction, ...]
    root: str
    is_entry: bool = False
    line: int | None = field(default=None, compare=False, hash=False)

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    def __getitem__(self, name: str) -> Instruction:
        return self.by_name[name]

    @property
    def root_instruction(self) -> Instruction:
        return self.by_name[self.root]

    @cached_property
    def parameters(self) -> tuple[Instruction, ...]:
        """PARAMETER instructions ordered by parameter number."""
        ps = [i for i in self.instructions if i.op is Op.PARAMETER]
        return tuple(sorted(ps, key=lambda i: i.attr("parameter_number")))

    @cached_property
    def users(self) -> dict[str, tuple[str, ...]]:
        """name -> names of instructions that use it (in order, with repeats removed)."""
        out: dict[str, list[str]] = {i.name: [] for i in self.instructions}
        for i in self.instructions:
            for o in dict.fromkeys(i.operands):
                out[o].append(i.name)
        return {k: tuple(v) for k, v in out.items()}

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)


@dataclass(frozen=True)
class Module:
    """An HLO module: computations (callees before callers as printed) and the entry's name.

    `attrs` holds the header attributes (e.g. `is_scheduled`, `entry_computation_layout`)
    as raw text pairs, printed back verbatim.
    """

    name: str
    computations: tuple[Computation, ...]
    entry: str
    attrs: tuple[tuple[str, str], ...] = ()
    source: str | None = field(default=None, compare=False, hash=False)

    @cached_property
    def by_name(self) -> dict[str, Computation]:
        return {c.name: c for c in self.computations}

    def computation(self, name: str) -> Computation:
        return self.by_name[name]

    @property
    def entry_computation(self) -> Computation:
        return self.by_name[self.entry]

    @cached_property
    def key(self) -> str:
        """A structural hash of the module (names included)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def with_computations(self, comps: tuple[Computation, ...], entry: str | None = None) -> Module:
        return Module(self.name, comps, entry or self.entry, self.attrs, self.source)


def literal_array(inst: Instruction) -> np.ndarray:
    """The value of a CONSTANT instruction as a numpy array of its shape."""
    from .literal import parse_literal
    return parse_literal(inst.attr("literal"), inst.array_shape)
