"""hlo.Module -> HLO text that parser.parse_hlo reads back to an equal module.

Map:
  print_module(m)            header, callees before callers, ENTRY last among its callers
  print_computation(c)       `name (p: f32[2]) -> f32[2] {` ... `}`
  print_instruction(i)       `name = f32[2]{0} add(a, b), attr=value, ...` (no `%`, no indent, no ROOT)
  format_attr(key, value)    one attribute value as text (see hlo.py's docstring for the types)
  format_shape(shape)        `f32[2,3]{1,0}` / `(f32[], s32[2])`

The text is close to XLA's own: names print without `%`, typed attributes in sorted key order, then
opaque ones (metadata, ...),
`parameter(N)` and `constant(literal)` inline.
"""

from __future__ import annotations

from typing import Any

from .hlo import (
    OPAQUE_ATTRS,
    ArrayShape,
    Computation,
    ConvDims,
    Instruction,
    Module,
    Op,
    Shape,
    TupleShape,
    Window,
    WindowDim,
)


def print_module(m: Module) -> str:
    """The module as HLO text."""
    head = f"HloModule {m.name}" + "".join(f", {k}={v}" for k, v in m.attrs)
    body = [print_computation(c, entry=(c.name == m.entry)) for c in _callee_order(m)]
    return "\n\n".join([head, *body]) + "\n"


def _callee_order(m: Module) -> list[Computation]:
    """Computations in a post order of the call graph from the entry, then the unreachable ones.

    Keeps the module's order where it already puts callees first; iterative (no recursion limit).
    """
    by_name = m.by_name
    order: list[Computation] = []
    done: set[str] = set()
    roots = [c.name for c in m.computations if c.name != m.entry] + [m.entry]
    for root in roots:
        if root in done or root not in by_name:
            continue
        stack: list[tuple[str, list[str]]] = [(root, list(_callees(by_name[root])))]
        active = {root}
        while stack:
            name, todo = stack[-1]
            nxt = None
            while todo:
                cand = todo.pop(0)
                if cand in by_name and cand not in done and cand not in active:
                    nxt = cand
                    break
            if nxt is None:
                stack.pop()
                active.discard(name)
                done.add(name)
                order.append(by_name[name])
            else:
                active.add(nxt)
                stack.append((nxt, list(_callees(by_name[nxt]))))
    return order


def _callees(c: Computation) -> list[str]:
    return list(dict.fromkeys(n for i in c.instructions for n in i.called))


def print_computation(c: Computation, entry: bool = False) -> str:
    """One computation, with its signature, ROOT marked, `ENTRY` when `entry`."""
    params = ", ".join(f"{p.name}: {_sig_shape(p.shape)}" for p in c.parameters)
    root_shape = _sig_shape(c.by_name[c.root].shape) if c.root in c.by_name else "()"
    head = ("ENTRY " if entry else "") + f"{c.name} ({params}) -> {root_shape} {{"
    lines = [head]
    for i in c.instructions:
        lines.append(("  ROOT " if i.name == c.root else "  ") + print_instruction(i))
    lines.append("}")
    return "\n".join(lines)


def print_instruction(i: Instruction) -> str:
    """One instruction as `name = shape op(operands), attrs` (without ROOT and indentation)."""
    if i.op is Op.PARAMETER:
        inner = str(i.attr("parameter_number"))
        skip = {"parameter_number"}
    elif i.op is Op.CONSTANT:
        inner = str(i.attr("literal"))
        skip = {"literal"}
    else:
        inner = ", ".join(i.operands)
        skip = set()
    shown = [kv for kv in i.attrs if kv[0] not in skip]
    shown.sort(key=lambda kv: kv[0] in OPAQUE_ATTRS)  # typed attributes first, then metadata etc.
    attrs = "".join(f", {k}={format_attr(k, v)}" for k, v in shown)
    return f"{i.name} = {format_shape(i.shape)} {i.op.value}({inner}){attrs}"


def format_shape(shape: Shape) -> str:
    """A shape with its layout (when it has one)."""
    if isinstance(shape, TupleShape):
        return "(" + ", ".join(format_shape(e) for e in shape.elements) + ")"
    return str(shape)


def _sig_shape(shape: Shape) -> str:
    """A shape without layouts (as XLA prints computation signatures)."""
    if isinstance(shape, TupleShape):
        return "(" + ", ".join(_sig_shape(e) for e in shape.elements) + ")"
    return str(ArrayShape(shape.dtype, shape.dims))


def format_attr(key: str, value: Any) -> str:
    """An attribute value as text, by its type (and key, for the few keys whose text differs)."""
    if key == "custom_call_target":
        return f'"{value}"'
    if key == "slice":
        return "{" + ", ".join(f"[{s}:{l}]" if st == 1 else f"[{s}:{l}:{st}]" for s, l, st in value) + "}"
    if key == "padding":
        return "x".join(f"{lo}_{hi}" if it == 0 else f"{lo}_{hi}_{it}" for lo, hi, it in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Window):
        return format_window(value)
    if isinstance(value, ConvDims):
        return value.text or format_dim_labels(value)
    if isinstance(value, tuple):
        if key in ("to_apply", "calls"):
            return "{" + ", ".join(value) + "}"
        return "{" + ",".join(str(v) for v in value) + "}"
    return str(value)


def format_window(w: Window) -> str:
    """`{size=3x3 stride=2x2 pad=1_1x1_1}`: fields at their default values are left out."""
    d0 = WindowDim()
    if not w.dims:
        return "{}"
    parts = ["size=" + "x".join(str(d.size) for d in w.dims)]
    if any(d.stride != d0.stride for d in w.dims):
        parts.append("stride=" + "x".join(str(d.stride) for d in w.dims))
    if any(d.pad_lo or d.pad_hi for d in w.dims):
        parts.append("pad=" + "x".join(f"{d.pad_lo}_{d.pad_hi}" for d in w.dims))
    for fname in ("lhs_dilate", "rhs_dilate"):
        vals = w.field(fname)
        if any(v != 1 for v in vals):
            parts.append(f"{fname}=" + "x".join(str(v) for v in vals))
    if any(d.reversal for d in w.dims):
        parts.append("rhs_reversal=" + "x".join(str(int(d.reversal)) for d in w.dims))
    return "{" + " ".join(parts) + "}"


def format_dim_labels(cd: ConvDims) -> str:
    """dim_labels text from the roles (used when ConvDims.text is empty)."""
    def one(n: int, a: int, b: int, spatial: tuple[int, ...], letters: str) -> str:
        out = ["?"] * n
        out[a], out[b] = letters[0], letters[1]
        for k, p in enumerate(spatial):
            out[p] = str(k)
        return "".join(out)
    ns = len(cd.input_spatial) + 2
    return (one(ns, cd.input_batch, cd.input_feature, cd.input_spatial, "bf") + "_"
            + one(ns, cd.kernel_input_feature, cd.kernel_output_feature, cd.kernel_spatial, "io") + "->"
            + one(ns, cd.output_batch, cd.output_feature, cd.output_spatial, "bf"))
