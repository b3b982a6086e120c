"""Synthetic HLO workloads for cost-model training data (issue #5): the fixtures' kinds of subgraph at other shapes.

`synthetic_hlos(count, seed)` returns (label, HLO text) pairs drawn from seven families, each with random shapes
(powers of two and odd sizes, so split tails occur):
  dot        [M, K] x [K, N] (with a bias + ReLU epilogue half of the time)
  bdot       batched [B, M, K] x [B, K, N], sometimes with the right operand transposed (an attention-like NT dot)
  ew         an elementwise chain of 2-6 ops (mul, add, max, exp, tanh, sin, divide) over a 1-D or 2-D array
  rowred     a row reduction (sum or max) of [R, C]
  colred     a column reduction of [R, C]
  softmax    a row softmax of [R, C]
  norm       a row layer norm of [R, C] with scale and bias
Shapes are bounded so that one program runs in well under a second with any schedule (the data script measures
random schedules).  Used by `make_cost_model_data.py --synthetic N`.
"""
from __future__ import annotations

import numpy as np

_SIZES = (24, 48, 64, 96, 100, 128, 192, 256, 320, 384, 512, 640, 768, 1000, 1024)


def _dot(rng) -> tuple[str, str]:
    m, k, n = (int(rng.choice(_SIZES)) for _ in range(3))
    epi = bool(rng.integers(2))
    lines = [f"  a = f32[{m},{k}] parameter(0)", f"  b = f32[{k},{n}] parameter(1)",
             f"  d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"]
    if epi:
        lines += [f"  c = f32[{n}] parameter(2)", f"  cb = f32[{m},{n}] broadcast(c), dimensions={{1}}",
                  f"  s = f32[{m},{n}] add(d, cb)", "  z = f32[] constant(0)",
                  f"  zb = f32[{m},{n}] broadcast(z), dimensions={{}}", f"  ROOT r = f32[{m},{n}] maximum(s, zb)"]
    else:
        lines[-1] = "  ROOT " + lines[-1].strip()
    return f"dot_{m}x{k}x{n}{'_bias_relu' if epi else ''}", "\n".join(lines)


def _bdot(rng) -> tuple[str, str]:
    bt = int(rng.choice((2, 4, 8, 16, 32)))
    m, k, n = (int(rng.choice(_SIZES[:10])) for _ in range(3))
    nt = bool(rng.integers(2))
    rhs = f"f32[{bt},{n},{k}]" if nt else f"f32[{bt},{k},{n}]"
    lines = [f"  a = f32[{bt},{m},{k}] parameter(0)", f"  b = {rhs} parameter(1)",
             f"  ROOT d = f32[{bt},{m},{n}] dot(a, b), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, "
             f"rhs_batch_dims={{0}}, rhs_contracting_dims={{{2 if nt else 1}}}"]
    return f"bdot_{bt}x{m}x{k}x{n}{'_nt' if nt else ''}", "\n".join(lines)


def _shape2(rng, big: bool = False) -> tuple[int, int]:
    r = int(rng.choice((64, 100, 256, 512, 1000, 1024, 2048, 4096 if big else 1536)))
    c = int(rng.choice((32, 64, 100, 128, 256, 512, 1000, 1024)))
    return r, c


def _ew(rng) -> tuple[str, str]:
    r, c = _shape2(rng, big=True)
    shape = f"f32[{r},{c}]" if rng.integers(2) else f"f32[{r * c}]"
    ops = list(rng.choice(["multiply", "add", "maximum", "exponential", "tanh", "sine", "divide"],
                          int(rng.integers(2, 7))))
    lines = [f"  x = {shape} parameter(0)", f"  y = {shape} parameter(1)"]
    cur = "x"
    for i, op in enumerate(ops):
        if op in ("exponential", "tanh", "sine"):
            lines.append(f"  v{i} = {shape} {op}({cur})")
        else:
            lines.append(f"  v{i} = {shape} {op}({cur}, y)")
        cur = f"v{i}"
    lines[-1] = "  ROOT " + lines[-1].strip()
    return f"ew_{shape.replace('f32', '').replace(',', 'x')}_{'-'.join(o[:3] for o in ops)}", "\n".join(lines)


def _red(rng, axis: int) -> tuple[str, str]:
    r, c = _shape2(rng, big=True)
    op = "add" if rng.integers(3) else "maximum"
    init = "0" if op == "add" else "-inf"
    out = r if axis == 1 else c
    lines = [f"  x = f32[{r},{c}] parameter(0)", f"  z = f32[] constant({init})",
             f"  ROOT s = f32[{out}] reduce(x, z), dimensions={{{axis}}}, to_apply={op}_f32"]
    return f"{'row' if axis == 1 else 'col'}{op[:3]}_{r}x{c}", "\n".join(lines)


def _softmax(rng) -> tuple[str, str]:
    r, c = _shape2(rng)
    lines = [f"  x = f32[{r},{c}] parameter(0)", "  ninf = f32[] constant(-inf)", "  zero = f32[] constant(0)",
             f"  mx = f32[{r}] reduce(x, ninf), dimensions={{1}}, to_apply=maximum_f32",
             f"  mb = f32[{r},{c}] broadcast(mx), dimensions={{0}}", f"  sh = f32[{r},{c}] subtract(x, mb)",
             f"  ex = f32[{r},{c}] exponential(sh)",
             f"  sm = f32[{r}] reduce(ex, zero), dimensions={{1}}, to_apply=add_f32",
             f"  sb = f32[{r},{c}] broadcast(sm), dimensions={{0}}", f"  ROOT o = f32[{r},{c}] divide(ex, sb)"]
    return f"softmax_{r}x{c}", "\n".join(lines)


def _norm(rng) -> tuple[str, str]:
    r, c = _shape2(rng)
    lines = [f"  x = f32[{r},{c}] parameter(0)", f"  g = f32[{c}] parameter(1)", f"  b = f32[{c}] parameter(2)",
             "  zero = f32[] constant(0)", f"  n = f32[] constant({c})", "  eps = f32[] constant(1e-05)",
             f"  s = f32[{r}] reduce(x, zero), dimensions={{1}}, to_apply=add_f32",
             f"  nb = f32[{r}] broadcast(n), dimensions={{}}", f"  mean = f32[{r}] divide(s, nb)",
             f"  mb = f32[{r},{c}] broadcast(mean), dimensions={{0}}", f"  xc = f32[{r},{c}] subtract(x, mb)",
             f"  sq = f32[{r},{c}] multiply(xc, xc)",
             f"  vs = f32[{r}] reduce(sq, zero), dimensions={{1}}, to_apply=add_f32",
             f"  var = f32[{r}] divide(vs, nb)", f"  eb = f32[{r}] broadcast(eps), dimensions={{}}",
             f"  ve = f32[{r}] add(var, eb)", f"  rs = f32[{r}] rsqrt(ve)",
             f"  rb = f32[{r},{c}] broadcast(rs), dimensions={{0}}", f"  y = f32[{r},{c}] multiply(xc, rb)",
             f"  gb = f32[{r},{c}] broadcast(g), dimensions={{1}}", f"  yg = f32[{r},{c}] multiply(y, gb)",
             f"  bb = f32[{r},{c}] broadcast(b), dimensions={{1}}", f"  ROOT o = f32[{r},{c}] add(yg, bb)"]
    return f"norm_{r}x{c}", "\n".join(lines)


_FAMILIES = (_dot, _dot, _bdot, _ew, lambda r: _red(r, 1), lambda r: _red(r, 0), _softmax, _norm)
_REGIONS = """add_f32 {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT r = f32[] add(p, q)
}

maximum_f32 {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT r = f32[] maximum(p, q)
}
"""


def synthetic_hlos(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` distinct (label, HLO module text) pairs, families taken in turn, shapes drawn by `seed`."""
    rng = np.random.default_rng(seed)
    out: dict[str, str] = {}
    tries = 0
    while len(out) < count and tries < 50 * count:
        fam = _FAMILIES[tries % len(_FAMILIES)]
        tries += 1
        label, body = fam(rng)
        if label not in out:
            out[label] = f"HloModule syn_{len(out)}\n\n{_REGIONS}\nENTRY main {{\n{body}\n}}\n"
    return list(out.items())
