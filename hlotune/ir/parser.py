"""HLO text -> hlo.Module.

Map:
  parse_hlo(text, file)     the whole text (JAX pre-optimization or XLA optimized HLO) -> Module
  load_hlo(path)            reads a file and parses it (errors name the file)
  parse_and_verify(text)    parse_hlo + verify.verify_module
  _Cursor                   a position in one line: whitespace/comments, tokens, errors with line:column
  _Parser                   line-oriented driver: header, skipped sections, computations, instructions
  _shape, _attr_value       shapes (arrays with layouts, nested tuples) and typed attribute values
  _ATTR_KIND                attribute key -> how its value is read (see hlo.py's docstring)

The text is read one line at a time (XLA prints one instruction per line); inside a line a
cursor walks compiled regexes.  Names lose their `%`.  `parameter(N)` becomes the attribute
`parameter_number=N`; `constant(...)` becomes `literal=<canonical text>`.  Computation
signatures `(p: f32[2]) -> f32[2]` are read and dropped (the parameters say the same).
A computation without ROOT takes its last instruction as root; a module without ENTRY
takes its last computation as entry (both as XLA does).

Element types: any `DType` value.  `u64`, `s16`, `u16` and `token` (EXTRA_TYPE_NAMES, seen only
in custom-call workspaces of XLA's GPU text) are not DType members, so they raise
UnsupportedError naming the type; adding them to `DType` makes this parser accept them
without change (the lookup is by the enum's values).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import HlotuneError, ParseError, UnsupportedError
from .hlo import (
    OPAQUE_ATTRS,
    ArrayShape,
    Computation,
    ConvDims,
    DType,
    Instruction,
    Module,
    Op,
    Shape,
    TupleShape,
    Window,
    WindowDim,
    make_attrs,
)
from .literal import format_literal, parse_literal

_WS = re.compile(r"(?:\s+|/\*.*?\*/)*")
_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_INT = re.compile(r"-?\d+")
_WORD = re.compile(r"[\w.\-$]+")
_OPCODE = re.compile(r"[a-z][a-z0-9\-]*")
_KEY = re.compile(r"[A-Za-z_][\w\-]*")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")
_SHAPE_START = re.compile(r"\(|[a-z][a-z0-9]*\[")
_RAW_STOP = re.compile(r'[{}()\[\]",]')
_STRING_STOP = re.compile(r'["\\]')
_DIMS = re.compile(r"\d+")
_TOKEN_AT = re.compile(r"\S{1,24}")
_ENTRY = re.compile(r"ENTRY\s")
_ROOT = re.compile(r"ROOT\s")
_PAD_TEXT = re.compile(r"[\d_x\-]*")
_WINDOW_VALUE = re.compile(r"[\d_x\-]+")
_DIM_LABELS = re.compile(r"([a-z0-9]+)_([a-z0-9]+)->([a-z0-9]+)")
_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
_DTYPES = {d.value: d for d in DType}
_OPS = {o.value: o for o in Op}
_MAX_DEPTH = 64

_INT_TUPLE_KEYS = frozenset({
    "dimensions", "lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims",
    "dynamic_slice_sizes", "slice_sizes", "offset_dims", "collapsed_slice_dims", "start_index_map",
    "operand_batching_dims", "start_indices_batching_dims",
})
_INT_KEYS = frozenset({"index", "iota_dimension", "index_vector_dim", "feature_group_count", "batch_group_count"})
_WORD_KEYS = frozenset({"direction", "type", "kind"})
_BOOL_KEYS = frozenset({"indices_are_sorted", "unique_indices"})
#: attributes kept as raw text besides OPAQUE_ATTRS (harmless annotations seen in the wild)
_EXTRA_OPAQUE = frozenset({"parameter_replication", "execution_thread", "scheduling_name"})


def parse_hlo(text: str, file: str | None = None) -> Module:
    """Parse HLO text into a Module (no verification; see `parse_and_verify`).

    Raises ParseError (malformed text) or UnsupportedError (unknown opcode, element type or
    attribute), naming the file (when given), line, column and offending token.
    """
    return _Parser(text, file).module()


def load_hlo(path: str | Path) -> Module:
    """Read and parse an HLO text file; errors carry the file name."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ParseError(f"cannot read HLO file: {e}", file=str(p)) from None
    return parse_hlo(text, file=str(p))


def parse_and_verify(text: str, file: str | None = None) -> Module:
    """parse_hlo then verify.verify_module (ShapeError on shapes that do not agree)."""
    from .verify import verify_module
    m = parse_hlo(text, file)
    try:
        return verify_module(m)
    except HlotuneError as e:
        raise (e.with_file(file) if file else e) from None


class _Cursor:
    """A read position inside one source line."""

    __slots__ = ("s", "pos", "line", "file")

    def __init__(self, s: str, line: int, file: str | None):
        self.s, self.pos, self.line, self.file = s, 0, line, file

    def fail(self, msg: str, cls: type[HlotuneError] = ParseError, pos: int | None = None) -> None:
        pos = self.pos if pos is None else pos
        raise cls(msg, file=self.file, line=self.line, column=pos + 1)

    def found(self, pos: int | None = None) -> str:
        m = _TOKEN_AT.match(self.s, self.pos if pos is None else pos)
        return f"'{m.group()}'" if m else "end of line"

    def ws(self) -> None:
        self.pos = _WS.match(self.s, self.pos).end()

    def at_end(self) -> bool:
        self.ws()
        return self.pos >= len(self.s)

    def peek(self) -> str:
        self.ws()
        return self.s[self.pos:self.pos + 1]

    def eat(self, lit: str) -> bool:
        self.ws()
        if self.s.startswith(lit, self.pos):
            self.pos += len(lit)
            return True
        return False

    def expect(self, lit: str) -> None:
        if not self.eat(lit):
            self.fail(f"expected '{lit}' but found {self.found()}")

    def match(self, rx: re.Pattern, what: str) -> re.Match:
        self.ws()
        m = rx.match(self.s, self.pos)
        if m is None:
            self.fail(f"expected {what} but found {self.found()}")
        self.pos = m.end()
        return m

    def name(self) -> str:
        return self.match(_NAME, "a name").group(1)

    def int(self) -> int:
        return int(self.match(_INT, "an integer").group())

    def raw(self) -> str:
        """Raw text up to a ',' at bracket depth 0 or the end of the line (quotes respected)."""
        self.ws()
        s, start, depth, pos = self.s, self.pos, 0, self.pos
        while True:
            m = _RAW_STOP.search(s, pos)
            if m is None:
                pos = len(s)
                break
            ch, pos = m.group(), m.start()
            if ch == '"':
                pos = self._skip_string(pos)
                continue
            if ch == "," and depth == 0:
                break
            if ch in "{([":
                depth += 1
            elif ch in "})]":
                depth -= 1
                if depth < 0:
                    self.fail(f"unbalanced '{ch}'", pos=pos)
            pos += 1
        if depth != 0:
            self.fail("unbalanced brackets in attribute value", pos=start)
        self.pos = pos
        text = s[start:pos].rstrip()
        if not text:
            self.fail(f"expected a value but found {self.found(start)}", pos=start)
        return text

    def _skip_string(self, pos: int) -> int:
        """Position after the string literal starting at `pos` (a '"')."""
        s, p = self.s, pos + 1
        while True:
            m = _STRING_STOP.search(s, p)
            if m is None:
                self.fail("unterminated string", pos=pos)
            if m.group() == "\\":
                p = m.start() + 2
                continue
            return m.end()

    def string(self) -> str:
        """A double-quoted string; returns its inner text as written (escapes kept)."""
        self.ws()
        if not self.s.startswith('"', self.pos):
            self.fail(f"expected a quoted string but found {self.found()}")
        end = self._skip_string(self.pos)
        inner = self.s[self.pos + 1:end - 1]
        self.pos = end
        return inner


class _Parser:
    def __init__(self, text: str, file: str | None):
        self.text, self.file = text, file
        self.lines = text.split("\n")
        self.i = 0

    # ---- module level -------------------------------------------------------------------
    def module(self) -> Module:
        name, attrs = self._header()
        comps: list[Computation] = []
        entry: str | None = None
        seen: set[str] = set()
        while self.i < len(self.lines):
            line = self.lines[self.i].strip()
            if not line or line.startswith("//"):
                self.i += 1
            elif line in _SECTIONS:
                self._skip_section()
            else:
                comp = self._computation()
                if comp.name in seen:
                    raise ParseError(f"duplicate computation name '{comp.name}'", file=self.file, line=comp.line)
                seen.add(comp.name)
                if comp.is_entry:
                    if entry is not None:
                        raise ParseError(f"second ENTRY computation '{comp.name}' (first: '{entry}')",
                                         file=self.file, line=comp.line)
                    entry = comp.name
                comps.append(comp)
        if not comps:
            raise ParseError("module has no computations", file=self.file, line=len(self.lines))
        if entry is None:
            last = comps[-1]
            comps[-1] = Computation(last.name, last.instructions, last.root, True, last.line)
            entry = last.name
        return Module(name, tuple(comps), entry, attrs, self.text)

    def _header(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        while self.i < len(self.lines) and (not self.lines[self.i].strip()
                                            or self.lines[self.i].lstrip().startswith("//")):
            self.i += 1
        if self.i >= len(self.lines):
            raise ParseError("empty HLO text (expected 'HloModule')", file=self.file, line=1)
        c = self._cursor()
        self.i += 1
        c.ws()
        if not c.s.startswith("HloModule", c.pos):
            c.fail(f"expected 'HloModule' but found {c.found()}")
        c.pos += len("HloModule")
        name = c.name()
        attrs: list[tuple[str, str]] = []
        while c.eat(","):
            key = c.match(_KEY, "an attribute name").group()
            c.expect("=")
            attrs.append((key, c.raw()))
        if not c.at_end():
            c.fail(f"expected ',' or end of line but found {c.found()}")
        return name, tuple(attrs)

    def _skip_section(self) -> None:
        self.i += 1
        while self.i < len(self.lines):
            line = self.lines[self.i].strip()
            if line and not line[0].isdigit():
                return
            self.i += 1

    def _cursor(self) -> _Cursor:
        return _Cursor(self.lines[self.i], self.i + 1, self.file)

    # ---- computations ---------------------------------------------------------------------
    def _computation(self) -> Computation:
        c = self._cursor()
        start_line = c.line
        is_entry = False
        c.ws()
        if _ENTRY.match(c.s, c.pos):
            is_entry = True
            c.pos += 5
        name = c.name()
        if c.peek() == "(":
            self._signature(c)
        c.expect("{")
        if not c.at_end():
            c.fail(f"expected end of line after '{{' but found {c.found()}")
        self.i += 1
        insts: list[Instruction] = []
        names: set[str] = set()
        root: str | None = None
        while True:
            if self.i >= len(self.lines):
                raise ParseError(f"computation '{name}' is not closed by '}}'", file=self.file, line=start_line)
            line = self.lines[self.i]
            stripped = line.strip()
            if not stripped or stripped.startswith("//"):
                self.i += 1
                continue
            if stripped.startswith("}"):
                self._close(self._cursor())
                self.i += 1
                break
            inst, is_root = self._instruction(self._cursor())
            self.i += 1
            if inst.name in names:
                raise ParseError(f"duplicate instruction name '{inst.name}' in computation '{name}'",
                                 file=self.file, line=inst.line, op=inst.name)
            names.add(inst.name)
            if is_root:
                if root is not None:
                    raise ParseError(f"second ROOT '{inst.name}' in computation '{name}' (first: '{root}')",
                                     file=self.file, line=inst.line, op=inst.name)
                root = inst.name
            insts.append(inst)
        if not insts:
            raise ParseError(f"computation '{name}' has no instructions", file=self.file, line=start_line)
        return Computation(name, tuple(insts), root or insts[-1].name, is_entry, start_line)

    def _close(self, c: _Cursor) -> None:
        c.expect("}")
        if c.eat(","):  # `}, execution_thread="..."`: annotations of the computation, dropped
            c.match(_KEY, "an attribute name")
            c.expect("=")
            c.raw()
        if not c.at_end():
            c.fail(f"expected end of line after '}}' but found {c.found()}")

    def _signature(self, c: _Cursor) -> None:
        c.expect("(")
        if not c.eat(")"):
            while True:
                c.name()
                c.expect(":")
                _shape(c)
                if c.eat(")"):
                    break
                c.expect(",")
        c.expect("->")
        _shape(c)

    # ---- instructions ---------------------------------------------------------------------
    def _instruction(self, c: _Cursor) -> tuple[Instruction, bool]:
        c.ws()
        is_root = False
        if _ROOT.match(c.s, c.pos):
            is_root = True
            c.pos += 4
        name = c.name()
        c.expect("=")
        shape = _shape(c)
        c.ws()
        op_pos = c.pos
        opname = c.match(_OPCODE, "an opcode").group()
        op = _OPS.get(opname)
        if op is None:
            c.fail(f"unsupported opcode '{opname}'", UnsupportedError, pos=op_pos)
        attrs: dict[str, Any] = {}
        c.expect("(")
        operands: tuple[str, ...] = ()
        if op is Op.PARAMETER:
            attrs["parameter_number"] = c.int()
            c.expect(")")
        elif op is Op.CONSTANT:
            attrs["literal"] = self._literal(c, shape)
        else:
            operands = self._operands(c)
        while c.eat(","):
            key_pos = c.pos
            key = c.match(_KEY, "an attribute name").group()
            if key in attrs:
                c.fail(f"duplicate attribute '{key}'", pos=key_pos)
            c.expect("=")
            attrs[key] = _attr_value(c, key, key_pos)
        if not c.at_end():
            c.fail(f"expected ',' or end of line but found {c.found()}")
        return Instruction(name, op, shape, operands, make_attrs(attrs), c.line), is_root

    def _operands(self, c: _Cursor) -> tuple[str, ...]:
        out: list[str] = []
        if c.eat(")"):
            return ()
        while True:
            c.ws()
            if _SHAPE_START.match(c.s, c.pos):  # old style `f32[2] %x`
                _shape(c)
            out.append(c.name())
            if c.eat(")"):
                return tuple(out)
            if not c.eat(","):
                c.fail(f"expected ',' or ')' in the operand list but found {c.found()}")

    def _literal(self, c: _Cursor, shape: Shape) -> str:
        c.ws()
        start = c.pos
        depth = 0
        s = c.s
        pos = start
        while pos < len(s):
            ch = s[pos]
            if ch == "(":
                depth += 1
            elif ch == ")":
                if depth == 0:
                    break
                depth -= 1
            pos += 1
        else:
            c.fail("constant literal is not closed by ')'", pos=start)
        text = s[start:pos].strip()
        c.pos = pos + 1
        if not isinstance(shape, ArrayShape):
            c.fail("tuple-shaped constants are not supported", UnsupportedError, pos=start)
        try:
            return format_literal(parse_literal(text, shape), shape.dtype)
        except HlotuneError as e:
            raise type(e)(e.message, file=self.file, line=c.line, column=start + 1) from None


# ---- shapes ----------------------------------------------------------------------------------
def _shape(c: _Cursor, depth: int = 0) -> Shape:
    if depth > _MAX_DEPTH:
        c.fail("tuple shape nested too deeply")
    if c.eat("("):
        elems: list[Shape] = []
        if not c.eat(")"):
            while True:
                elems.append(_shape(c, depth + 1))
                if c.eat(")"):
                    break
                c.expect(",")
        return TupleShape(tuple(elems))
    c.ws()
    pos = c.pos
    m = _ARRAY.match(c.s, pos)
    if m is None:
        c.fail(f"expected a shape but found {c.found()}")
    dtype = _DTYPES.get(m.group(1))
    if dtype is None:
        c.fail(f"unsupported element type '{m.group(1)}'", UnsupportedError, pos=pos)
    c.pos = m.end()
    body = m.group(2).strip()
    dims: tuple[int, ...] = ()
    if body:
        parts = [p.strip() for p in body.split(",")]
        for p in parts:
            if not _DIMS.fullmatch(p):
                cls = UnsupportedError if ("<=" in p or "?" in p) else ParseError
                c.fail(f"bad dimension '{p}' in shape {m.group()!r}", cls, pos=pos)
        dims = tuple(int(p) for p in parts)
    layout = None
    if c.s.startswith("{", c.pos):
        layout = _layout(c)
    return ArrayShape(dtype, dims, layout)


def _layout(c: _Cursor) -> tuple[int, ...]:
    """`{1,0}` or `{1,0:T(8,128)S(1)}`: the minor-to-major list; tiling etc. dropped."""
    start = c.pos
    end = c.s.find("}", start)
    if end < 0:
        c.fail("layout is not closed by '}'", pos=start)
    body = c.s[start + 1:end].split(":", 1)[0].strip()
    c.pos = end + 1
    if not body:
        return ()
    parts = [p.strip() for p in body.split(",")]
    if not all(_DIMS.fullmatch(p) for p in parts):
        c.fail(f"bad layout {c.s[start:end + 1]!r}", pos=start)
    return tuple(int(p) for p in parts)


# ---- attribute values --------------------------------------------------------------------------
def _attr_value(c: _Cursor, key: str, key_pos: int) -> Any:
    kind = _ATTR_KIND.get(key)
    if kind is None:
        if key in OPAQUE_ATTRS or key in _EXTRA_OPAQUE:
            return c.raw()
        c.fail(f"unsupported attribute '{key}'", UnsupportedError, pos=key_pos)
    return kind(c)


def _int_tuple(c: _Cursor) -> tuple[int, ...]:
    c.expect("{")
    out: list[int] = []
    if c.eat("}"):
        return ()
    while True:
        out.append(c.int())
        if c.eat("}"):
            return tuple(out)
        c.expect(",")


def _word(c: _Cursor) -> str:
    return c.match(_WORD, "a word").group()


def _callee(c: _Cursor) -> str | tuple[str, ...]:
    if not c.eat("{"):
        return c.name()
    names = [c.name()]
    while c.eat(","):
        names.append(c.name())
    c.expect("}")
    return names[0] if len(names) == 1 else tuple(names)


def _bool(c: _Cursor) -> bool:
    w = _word(c)
    if w not in ("true", "false"):
        c.fail(f"expected true or false but found '{w}'", pos=c.pos - len(w))
    return w == "true"


def _slice(c: _Cursor) -> tuple[tuple[int, int, int], ...]:
    c.expect("{")
    out: list[tuple[int, int, int]] = []
    if c.eat("}"):
        return ()
    while True:
        c.expect("[")
        start = c.int()
        c.expect(":")
        limit = c.int()
        stride = c.int() if c.eat(":") else 1
        c.expect("]")
        out.append((start, limit, stride))
        if c.eat("}"):
            return tuple(out)
        c.expect(",")


def _padding(c: _Cursor) -> tuple[tuple[int, int, int], ...]:
    c.ws()
    pos = c.pos
    m = _PAD_TEXT.match(c.s, pos)
    text = m.group()
    c.pos = m.end()
    if not text:
        return ()
    out = []
    for part in text.split("x"):
        nums = part.split("_")
        if len(nums) not in (2, 3) or not all(_INT.fullmatch(n) for n in nums):
            c.fail(f"bad padding '{text}' (expected lo_hi[_interior] per dimension, joined by 'x')", pos=pos)
        v = [int(n) for n in nums] + [0] * (3 - len(nums))
        out.append((v[0], v[1], v[2]))
    return tuple(out)


_WINDOW_FIELDS = {"size": "size", "stride": "stride", "lhs_dilate": "lhs_dilate", "rhs_dilate": "rhs_dilate",
                  "rhs_reversal": "reversal"}


def _window(c: _Cursor) -> Window:
    start = c.pos
    c.expect("{")
    fields: dict[str, list] = {}
    while not c.eat("}"):
        fpos = c.pos
        key = c.match(_KEY, "a window field").group()
        c.expect("=")
        val = c.match(_WINDOW_VALUE, "window field values").group()
        if key in fields:
            c.fail(f"duplicate window field '{key}'", pos=fpos)
        if key == "pad":
            pairs = [p.split("_") for p in val.split("x")]
            if not all(len(p) == 2 and all(_INT.fullmatch(n) for n in p) for p in pairs):
                c.fail(f"bad window pad '{val}'", pos=fpos)
            fields["pad"] = [(int(a), int(b)) for a, b in pairs]
        elif key in _WINDOW_FIELDS:
            parts = val.split("x")
            if not all(_INT.fullmatch(p) for p in parts):
                c.fail(f"bad window {key} '{val}'", pos=fpos)
            fields[key] = [int(p) for p in parts]
        else:
            c.fail(f"unknown window field '{key}'", pos=fpos)
    n = len(next(iter(fields.values()))) if fields else 0
    if any(len(v) != n for v in fields.values()):
        c.fail("window fields have different numbers of dimensions", pos=start)
    dims = []
    for k in range(n):
        kw = {_WINDOW_FIELDS[f]: v[k] for f, v in fields.items() if f != "pad"}
        if "reversal" in kw:
            kw["reversal"] = bool(kw["reversal"])
        if "pad" in fields:
            kw["pad_lo"], kw["pad_hi"] = fields["pad"][k]
        dims.append(WindowDim(**kw))
    return Window(tuple(dims))


def _dim_labels(c: _Cursor) -> ConvDims:
    c.ws()
    pos = c.pos
    m = _DIM_LABELS.match(c.s, pos)
    if m is None:
        c.fail(f"expected dim_labels like b01f_01io->b01f but found {c.found()}")
    c.pos = m.end()
    try:
        return parse_dim_labels(m.group())
    except ValueError as e:
        c.fail(f"bad dim_labels '{m.group()}': {e}", pos=pos)
        raise


def parse_dim_labels(text: str) -> ConvDims:
    """`b01f_01io->b01f` -> ConvDims (ValueError when malformed)."""
    lhs, rest = text.split("_", 1)
    rhs, out = rest.split("->", 1)
    ib, if_, isp = _roles(lhs, "bf")
    ki, ko, ksp = _roles(rhs, "io")
    ob, of, osp = _roles(out, "bf")
    if not len(isp) == len(ksp) == len(osp):
        raise ValueError("different numbers of spatial dimensions")
    return ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp, text)


def _roles(labels: str, letters: str) -> tuple[int, int, tuple[int, ...]]:
    a, b = labels.find(letters[0]), labels.find(letters[1])
    digits = [ch for ch in labels if ch.isdigit()]
    if a < 0 or b < 0 or labels.count(letters[0]) != 1 or labels.count(letters[1]) != 1:
        raise ValueError(f"'{labels}' needs one '{letters[0]}' and one '{letters[1]}'")
    if len(digits) + 2 != len(labels) or sorted(digits) != [str(k) for k in range(len(digits))]:
        raise ValueError(f"'{labels}' must hold spatial digits 0..n-1 once each")
    spatial = tuple(labels.index(str(k)) for k in range(len(digits)))
    return a, b, spatial


_ATTR_KIND = {
    **{k: _int_tuple for k in _INT_TUPLE_KEYS},
    **{k: (lambda c: c.int()) for k in _INT_KEYS},
    **{k: _word for k in _WORD_KEYS},
    **{k: _bool for k in _BOOL_KEYS},
    "to_apply": _callee,
    "calls": _callee,
    "custom_call_target": lambda c: c.string(),
    "slice": _slice,
    "padding": _padding,
    "window": _window,
    "dim_labels": _dim_labels,
}
