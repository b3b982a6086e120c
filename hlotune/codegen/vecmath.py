"""Vectorizable transcendental functions emitted as LLVM IR (llvmlite).

Map: constants (Cody-Waite splits, Taylor / Chebyshev-fitted coefficients) -> `_Em` (typed IR helpers
over a scalar or vector float type: constants, fma, selects, bit casts, Horner) -> one emitter per op
(`_exp`, `_log`, `_sincos`, ...; branch-free, select-based, so a vector loop stays vectorized) ->
`_RULES` (table keyed by `Op`) -> per-module cache of internal `alwaysinline` helper functions
(`hlotune_<op>_<v8f32|f64|...>`) -> `emit_math` (public entry).

Only LLVM intrinsics that lower to vector instructions are used (`llvm.fma`, `llvm.fabs`, `llvm.floor`,
`llvm.roundeven`, `llvm.sqrt`, `llvm.copysign`, `llvm.minnum`, `llvm.maxnum`); no libm calls.  `llvm.fma`
needs a host with FMA (x86 `+fma`, every AArch64); elsewhere LLVM lowers it to a libm `fma` call,
which stays correct but is slow.  Accuracy and special values follow numpy (C99 libm); the measured
bounds are `ULP_BOUNDS` / `TRIG_ACCURATE_RANGE` (docs: the vector math table).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from llvmlite import ir

from hlotune.errors import UnsupportedError
from hlotune.ir.hlo import Op

# ---------------------------------------------------------------------------------------------------
# constants

_PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")
_LN2 = Fraction("0.693147180559945309417232121458176568075500134360255254120680009493393621969694715605")
_LOG2E = 1.0 / _LN2


def _round(v: Fraction | float, f64: bool) -> float:
    """Correctly rounded float64 or float32 (returned as a Python float) of an exact value."""
    v = Fraction(v)
    if f64:
        return float(v)
    c = np.float32(float(v))
    cands = [c, np.nextafter(c, np.float32(np.inf)), np.nextafter(c, np.float32(-np.inf))]
    return float(min(cands, key=lambda f: abs(Fraction(float(f)) - v)))


def _split(v: Fraction, f64: bool, parts: int, hi_bits: int | None = None) -> list[float]:
    """Split `v` into `parts` floats summing to it (Cody-Waite); the first keeps only `hi_bits` bits."""
    out, rest = [], Fraction(v)
    for i in range(parts):
        if i == 0 and hi_bits is not None:
            e = math.frexp(float(rest))[1]
            scale = Fraction(2) ** (hi_bits - e)
            piece = float(Fraction(round(rest * scale)) / scale)
        else:
            piece = _round(rest, f64)
        out.append(piece)
        rest -= Fraction(piece)
    return out


def _taylor(kind: str, n: int) -> list[float]:
    """Lowest-first coefficients of simple Taylor series (exact rationals, rounded at use)."""
    if kind == "exp":  # 1/k!
        return [1.0 / math.factorial(k) for k in range(n)]
    if kind == "sin":  # sin(r) = r + r^3 * P(r^2), P lowest-first
        return [(-1) ** (k + 1) / math.factorial(2 * k + 3) for k in range(n)]
    if kind == "cos":  # cos(r) = 1 + r^2 * P(r^2)
        return [(-1) ** (k + 1) / math.factorial(2 * k + 2) for k in range(n)]
    if kind == "atanh2":  # log1p via atanh: R = z * P(z), P = 2/3, 2/5, ...
        return [2.0 / (2 * k + 3) for k in range(n)]
    if kind == "atan":  # atan(t) = t + t^3 * P(t^2)
        return [(-1) ** (k + 1) / (2 * k + 3) for k in range(n)]
    raise KeyError(kind)


def _cheb_interp(f: Callable[[float], float], centre: float, halfwidth: float, deg: int) -> list[float]:
    """Monomial coefficients (in u = (x - centre) / halfwidth, lowest first) of the Chebyshev interpolant.

    Interpolation at first-kind Chebyshev nodes (near-minimax); sums and the basis change run in
    long double so the only errors left are those of the samples (about 1 ulp of f).
    """
    from numpy.polynomial import chebyshev

    n = deg + 1
    theta = np.pi * (np.arange(n, dtype=np.longdouble) + np.longdouble(0.5)) / n
    xs = [centre + halfwidth * float(t) for t in np.cos(theta)]
    u = np.array([(Fraction(x) - Fraction(centre)) / Fraction(halfwidth) for x in xs], dtype=np.longdouble)
    ys = np.array([f(x) for x in xs], dtype=np.longdouble)
    vander = chebyshev.chebvander(u, deg)  # Vandermonde at the (rounded) sample points, solved exactly
    coef = np.linalg.solve(vander.astype(np.float64), ys.astype(np.float64)).astype(np.longdouble)
    for _ in range(3):  # iterative refinement in long double
        resid = ys - vander @ coef
        coef = coef + np.linalg.solve(vander.astype(np.float64), resid.astype(np.float64))
    return [float(v) for v in chebyshev.cheb2poly(coef)]


@functools.cache
def _two_over_sqrt_pi() -> Fraction:
    from decimal import Decimal, getcontext

    getcontext().prec = 50
    d = Decimal(2) / (Decimal(_PI.numerator) / Decimal(_PI.denominator)).sqrt()
    return Fraction(d)


@functools.cache
def _erf_fits(f64: bool) -> tuple[list[float], list[tuple[float, list[float]]], float]:
    """erf pieces: Taylor near 0, Chebyshev interpolants (monomial, lowest first) further out.

    Returns (P0, pieces, clamp): erf(x) = x * P0(x^2) on [0, 1); erf(x) = P_i(2 (x - c_i)) on
    [c_i - 1/2, c_i + 1/2) for each piece (c_i, P_i); erf(x) = 1 from `clamp` on.
    """
    k = _two_over_sqrt_pi()
    p0 = [float(k * Fraction((-1) ** n, math.factorial(n) * (2 * n + 1))) for n in range(19 if f64 else 11)]
    clamp = 6.0 if f64 else 4.0
    deg = 22 if f64 else 10
    pieces = [(float(c), _cheb_interp(math.erf, float(c), 0.5, deg)) for c in np.arange(1.5, clamp, 1.0)]
    return p0, pieces, clamp


# ---------------------------------------------------------------------------------------------------
# typed IR helpers


class _Em:
    """IR emission helpers for one float type (scalar or vector of float/double)."""

    def __init__(self, b: ir.IRBuilder, ty: ir.Type):
        self.b, self.ty = b, ty
        self.lanes = ty.count if isinstance(ty, ir.VectorType) else 0
        elem = ty.element if self.lanes else ty
        self.f64 = isinstance(elem, ir.DoubleType)
        self.nbits = 64 if self.f64 else 32
        self.mant = 52 if self.f64 else 23
        self.bias = 1023 if self.f64 else 127
        self.shifter = 1.5 * 2.0 ** self.mant   # fma(x, c, shifter) rounds x c to an integer kept in the low bits
        ielem = ir.IntType(self.nbits)
        self.ity = ir.VectorType(ielem, self.lanes) if self.lanes else ielem
        self.suffix = (f"v{self.lanes}" if self.lanes else "") + ("f64" if self.f64 else "f32")

    def with_type(self, ty: ir.Type) -> _Em:
        return _Em(self.b, ty)

    # constants
    def c(self, v: float) -> ir.Constant:
        v = v if not math.isfinite(v) else _round(Fraction(v), self.f64)
        elem = self.ty.element if self.lanes else self.ty
        return ir.Constant(self.ty, [v] * self.lanes) if self.lanes else ir.Constant(elem, v)

    def ci(self, v: int) -> ir.Constant:
        return ir.Constant(self.ity, [v] * self.lanes) if self.lanes else ir.Constant(self.ity, v)

    # arithmetic
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def intrinsic(self, name: str, *args):
        module = self.b.block.function.module
        full = f"llvm.{name}.{self.suffix}"
        try:
            fn = module.get_global(full)
        except KeyError:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * len(args)), full)
        return self.b.call(fn, list(args))

    def fma(self, a, b, c):
        return self.intrinsic("fma", a, b, c)

    def abs(self, a):
        return self.intrinsic("fabs", a)

    def floor(self, a):
        return self.intrinsic("floor", a)

    def rint(self, a):
        return self.intrinsic("roundeven", a)

    def copysign(self, mag, sgn):
        return self.intrinsic("copysign", mag, sgn)

    def clamp(self, a, lo: float, hi: float):
        """Clamp to [lo, hi]; NaN becomes lo (callers restore NaN with `keep_nan`)."""
        return self.intrinsic("minnum", self.intrinsic("maxnum", a, self.c(lo)), self.c(hi))

    def clamp_nan(self, a, lo: float, hi: float):
        """Clamp to [lo, hi]; NaN stays NaN (ordered compares are false on it), so a function whose later steps
        propagate NaN needs no NaN select at the end.  One max and one min instruction on x86, as `clamp`."""
        a = self.sel(self.cmp("<", a, self.c(lo)), self.c(lo), a)
        return self.sel(self.cmp(">", a, self.c(hi)), self.c(hi), a)

    # comparisons and selects (ordered: false on NaN)
    def cmp(self, op: str, a, b):
        return self.b.fcmp_ordered(op, a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def signbit(self, a):
        return self.b.icmp_signed("<", self.bits(a), self.ci(0))

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def keep_nan(self, x, res):
        return self.sel(self.isnan(x), x, res)

    def keep_zero(self, x, res):
        """Return x where x is +-0 (keeps the sign of zero for odd functions)."""
        return self.sel(self.cmp("==", x, self.c(0.0)), x, res)

    # bits
    def bits(self, a):
        return self.b.bitcast(a, self.ity)

    def from_bits(self, i):
        return self.b.bitcast(i, self.ty)

    def pow2(self, n_int):
        """2**n for an integer vector n in the normal exponent range."""
        return self.from_bits(self.b.shl(self.b.add(n_int, self.ci(self.bias)), self.ci(self.mant)))

    def poly(self, x, coeffs: list[float]):
        """Horner with fma; coefficients lowest first."""
        acc = self.c(coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(k))
        return acc


# ---------------------------------------------------------------------------------------------------
# exp family


@functools.cache
def _exp_q_f32() -> list[float]:
    """Q(r) ~ (exp(r) - 1 - r) / r^2 on |r| <= ln2 / 2 (with a margin), degree 4, Chebyshev-interpolated:
    1 + r (1 + r Q(r)) is within 8e-9 of exp(r) there, relatively (the degree-7 Taylor polynomial it replaced:
    7e-9), far below float32's half ulp (6e-8), for one FMA fewer."""
    def q(r: float) -> float:
        return math.fsum(r ** k / math.factorial(k + 2) for k in range(20))
    h = 0.35
    return [c / h ** k for k, c in enumerate(_cheb_interp(q, 0.0, h, 4))]


def _reduce_ln2(e: _Em, x):
    """(k, r) with x = n ln2 + r, n = rint(x log2e), for |x log2e| < 2**(mant - 1), by the shifter trick:
    k = fma(x, log2e, SHIFTER) rounds the exact product once and holds n in its low mantissa bits, so 2**n and n
    come from k's bits (no round or float-to-int instruction, and a NaN x stays NaN instead of becoming poison);
    r = x - n ln2 in two Cody-Waite FMAs."""
    shifter = e.c(e.shifter)
    k = e.fma(x, e.c(_LOG2E), shifter)
    n = e.sub(k, shifter)
    l_hi, l_lo = _split(_LN2, e.f64, 2, hi_bits=(42 if e.f64 else 16))
    r = e.fma(e.neg(n), e.c(l_hi), x)
    return k, e.fma(e.neg(n), e.c(l_lo), r)


def _exp_core(e: _Em, x, x_lo=None):
    """exp(x + x_lo), x_lo a tiny tail; NaN x gives NaN (the clamp keeps it and every later step propagates it)."""
    lo, hi = (-746.0, 710.0) if e.f64 else (-104.0, 89.0)
    k, r = _reduce_ln2(e, e.clamp_nan(x, lo, hi))
    if x_lo is not None:
        r = e.add(r, x_lo)
    if e.f64:
        p = e.poly(r, _taylor("exp", 14))
    else:   # 1 + r (1 + r Q(r)): six FMAs, one fewer than the degree-7 Taylor polynomial
        p = e.fma(e.fma(e.poly(r, _exp_q_f32()), r, e.c(1.0)), r, e.c(1.0))
    ni = e.b.sub(e.bits(k), e.bits(e.c(e.shifter)))
    n1 = e.b.ashr(ni, e.ci(1))
    n2 = e.b.sub(ni, n1)
    return e.mul(e.mul(p, e.pow2(n1)), e.pow2(n2))  # two steps: exact, then one rounding to denormal/inf


def _expm1_reduced(e: _Em, y):
    """expm1(y) for |y| <= 45 (f64) / 30 (f32), so that 2**n stays normal; NaN gives NaN.

    y = n ln2 + r (`_reduce_ln2`), 2**n = bits(k) << mant, expm1(r) = r + r^2 P(r), and fma(2^n, expm1(r), 2^n - 1).
    """
    k, r = _reduce_ln2(e, y)
    em = e.fma(e.mul(r, r), e.poly(r, _taylor("exp", 15 if e.f64 else 9)[2:]), r)  # expm1(r)
    s = e.from_bits(e.b.add(e.b.shl(e.bits(k), e.ci(e.mant)), e.ci(e.bias << e.mant)))
    return e.fma(s, em, e.sub(s, e.c(1.0)))  # 2^n (em + 1) - 1


def _expm1(e: _Em, x):
    big = 40.0 if e.f64 else 20.0
    xc = e.clamp(x, -45.0 if e.f64 else -30.0, big)
    res = _expm1_reduced(e, xc)
    res = e.sel(e.cmp(">", x, e.c(big)), _exp_core(e, x), res)
    return e.keep_zero(x, e.keep_nan(x, res))


# ---------------------------------------------------------------------------------------------------
# log family


def _log_parts(e: _Em, u):
    """Split u > 0 (denormals ok) into k (float) and f = m - 1 with m in [sqrt(1/2), sqrt(2))."""
    tiny = e.cmp("<", u, e.c(2.0 ** (-1022 if e.f64 else -126)))
    scale_bits = 54 if e.f64 else 25
    u = e.sel(tiny, e.mul(u, e.c(2.0 ** scale_bits)), u)
    k_adj = e.sel(tiny, e.c(-float(scale_bits)), e.c(0.0))
    one_bits = (e.bias << e.mant)
    sqrt_half_bits = 0x3FE6A09E667F3BCD if e.f64 else 0x3F3504F3
    ix = e.b.add(e.bits(u), e.ci(one_bits - sqrt_half_bits))
    k = e.b.sub(e.b.ashr(ix, e.ci(e.mant)), e.ci(e.bias))
    ix = e.b.add(e.b.and_(ix, e.ci((1 << e.mant) - 1)), e.ci(sqrt_half_bits))
    f = e.sub(e.from_bits(ix), e.c(1.0))
    return e.add(e.b.sitofp(k, e.ty), k_adj), f


def _log_core(e: _Em, u, extra=None):
    """log(u) for finite u > 0, plus an optional small correction term `extra` (added at low order)."""
    k, f = _log_parts(e, u)
    s = e.div(f, e.add(f, e.c(2.0)))
    z = e.mul(s, s)
    big_r = e.mul(z, e.poly(z, _taylor("atanh2", 11 if e.f64 else 4)))
    hfsq = e.mul(e.mul(e.c(0.5), f), f)
    l_hi, l_lo = _split(_LN2, e.f64, 2, hi_bits=(42 if e.f64 else 16))
    low = e.mul(k, e.c(l_lo))
    if extra is not None:
        low = e.add(low, extra)
    inner = e.sub(e.sub(hfsq, e.fma(s, e.add(hfsq, big_r), low)), f)
    return e.sub(e.mul(k, e.c(l_hi)), inner)


def _two_sum(e: _Em, a, b):
    """Error-free a + b = s + err (Knuth)."""
    s = e.add(a, b)
    bb = e.sub(s, a)
    return s, e.add(e.sub(a, e.sub(s, bb)), e.sub(b, bb))


def _log_dd(e: _Em, u):
    """log(u) as hi + lo (about 2**-60 relative) for finite u > 0; used by float64 pow."""
    k, f = _log_parts(e, u)
    d = e.add(f, e.c(2.0))
    d_lo = e.add(e.sub(e.c(2.0), d), f)  # 2 + f = d + d_lo exactly (|f| < 2)
    s_hi = e.div(f, d)
    rem = e.fma(e.neg(s_hi), d, f)  # exact division residual
    s_lo = e.div(e.sub(rem, e.mul(s_hi, d_lo)), d)
    z = e.mul(s_hi, s_hi)
    tail = e.mul(e.mul(s_hi, z), e.poly(z, _taylor("atanh2", 11)))  # 2 atanh(s) - 2 s
    l_hi, l_lo = _split(_LN2, True, 2, hi_bits=42)
    hi, err = _two_sum(e, e.mul(k, e.c(l_hi)), e.add(s_hi, s_hi))
    lo = e.add(err, e.add(e.fma(k, e.c(l_lo), e.add(s_lo, s_lo)), tail))
    return _two_sum(e, hi, lo)


def _log_specials(e: _Em, u, res):
    inf = e.c(math.inf)
    res = e.sel(e.cmp("==", u, inf), inf, res)
    res = e.sel(e.cmp("==", u, e.c(0.0)), e.c(-math.inf), res)
    res = e.sel(e.cmp("<", u, e.c(0.0)), e.c(math.nan), res)
    return e.keep_nan(u, res)


def _log(e: _Em, x):
    return _log_specials(e, x, _log_core(e, x))


def _log1p(e: _Em, x):
    u = e.add(x, e.c(1.0))
    c = e.div(e.sub(x, e.sub(u, e.c(1.0))), u)  # rounding error of 1 + x, relative to u
    res = _log_specials(e, u, _log_core(e, u, c))
    return e.keep_zero(x, res)


# ---------------------------------------------------------------------------------------------------
# hyperbolic / sigmoid / erf


def _tanh(e: _Em, x):
    """copysign(t / (t + 2), x), t = expm1(2 min(|x|, 20 or 10)): one division, no clamps or specials paths
    (NaN flows through as NaN, inf saturates at 1, -0 keeps its sign through copysign)."""
    ax = e.abs(x)
    lim = e.c(20.0 if e.f64 else 10.0)
    a = e.sel(e.cmp(">", ax, lim), lim, ax)  # NaN stays NaN
    t = _expm1_reduced(e, e.add(a, a))
    return e.copysign(e.div(t, e.add(t, e.c(2.0))), x)


def _logistic(e: _Em, x):
    ex = _call_helper(e, Op.EXP, [e.neg(e.abs(x))])
    num = e.sel(e.signbit(x), ex, e.c(1.0))  # one division: e/(1+e) for x < 0, 1/(1+e) otherwise
    return e.div(num, e.add(e.c(1.0), ex))


def _erf(e: _Em, x):
    p0, pieces, clamp = _erf_fits(e.f64)
    ax = e.abs(x)
    small = e.mul(ax, e.poly(e.mul(ax, ax), p0))
    a = e.sel(e.cmp(">", ax, e.c(clamp)), e.c(clamp), ax)
    centre = e.c(pieces[0][0])
    coeffs = [e.c(v) for v in pieces[0][1]]
    for c, co in pieces[1:]:
        m = e.cmp(">=", a, e.c(c - 0.5))
        centre = e.sel(m, e.c(c), centre)
        coeffs = [e.sel(m, e.c(v), old) for v, old in zip(co, coeffs)]
    u = e.mul(e.sub(a, centre), e.c(2.0))
    acc = coeffs[-1]
    for k in reversed(coeffs[:-1]):
        acc = e.fma(acc, u, k)
    big = e.intrinsic("minnum", acc, e.c(1.0))
    res = e.sel(e.cmp("<", ax, e.c(1.0)), small, big)
    return e.keep_nan(x, e.copysign(res, x))


# ---------------------------------------------------------------------------------------------------
# trigonometric


def _sincos(e: _Em, x, cosine: bool):
    """sin/cos with 3-part Cody-Waite reduction by pi/2 (exact first step thanks to fma)."""
    k = e.rint(e.mul(x, e.c(2 / _PI)))
    r = x
    for piece in _split(_PI / 2, e.f64, 3):
        r = e.fma(e.neg(k), e.c(piece), r)
    kq = e.add(k, e.c(1.0)) if cosine else k  # cos(x) = sin(x + pi/2)
    q = e.sub(kq, e.mul(e.c(4.0), e.floor(e.mul(kq, e.c(0.25)))))  # quadrant: kq mod 4, as float
    z = e.mul(r, r)
    sp = e.fma(e.mul(r, z), e.poly(z, _taylor("sin", 8 if e.f64 else 4)), r)
    cp = e.fma(z, e.poly(z, _taylor("cos", 9 if e.f64 else 5)), e.c(1.0))
    odd = e.b.or_(e.cmp("==", q, e.c(1.0)), e.cmp("==", q, e.c(3.0)))
    val = e.sel(odd, cp, sp)
    val = e.sel(e.cmp(">=", q, e.c(2.0)), e.neg(val), val)
    val = e.intrinsic("minnum", e.intrinsic("maxnum", val, e.c(-1.0)), e.c(1.0))  # bounded beyond range
    val = e.keep_nan(r, val)  # inf -> NaN
    return val if cosine else e.keep_zero(x, val)


def _sine(e: _Em, x):
    return _sincos(e, x, cosine=False)


def _cosine(e: _Em, x):
    return _sincos(e, x, cosine=True)


def _atan2(e: _Em, y, x):
    ax, ay = e.abs(x), e.abs(y)
    swap = e.cmp(">", ay, ax)
    mx, mn = e.sel(swap, ay, ax), e.sel(swap, ax, ay)
    a = e.div(mn, mx)
    inf = e.c(math.inf)
    a = e.sel(e.cmp("==", mx, e.c(0.0)), e.c(0.0), a)
    a = e.sel(e.b.and_(e.cmp("==", ax, inf), e.cmp("==", ay, inf)), e.c(1.0), a)
    big = e.cmp(">", a, e.c(math.sqrt(2) - 1))
    t = e.sel(big, e.div(e.sub(a, e.c(1.0)), e.add(a, e.c(1.0))), a)
    z = e.mul(t, t)
    at = e.fma(e.mul(t, z), e.poly(z, _taylor("atan", 21 if e.f64 else 9)), t)
    # angle = m * pi/4 + sign * at, with m in 0..4 picked per lane, summed with one final rounding
    m = e.sel(big, e.c(1.0), e.c(0.0))
    m = e.sel(swap, e.sub(e.c(2.0), m), m)
    xneg = e.signbit(x)
    m = e.sel(xneg, e.sub(e.c(4.0), m), m)
    neg = e.b.xor(swap, xneg)
    c_hi, c_lo = e.c(0.0), e.c(0.0)
    for j in range(1, 5):
        hi, lo = _split(_PI * j / 4, e.f64, 2)
        hit = e.cmp("==", m, e.c(float(j)))
        c_hi, c_lo = e.sel(hit, e.c(hi), c_hi), e.sel(hit, e.c(lo), c_lo)
    ang = e.add(c_hi, e.add(c_lo, e.sel(neg, e.neg(at), at)))
    res = e.copysign(ang, y)
    return e.sel(e.b.or_(e.isnan(x), e.isnan(y)), e.add(x, y), res)


# ---------------------------------------------------------------------------------------------------
# power, sqrt


def _is_int(e: _Em, y):
    return e.b.and_(e.cmp("==", e.floor(y), y), e.cmp("!=", e.abs(y), e.c(math.inf)))


def _power(e: _Em, x, y):
    """C99 / numpy pow: |x|**y = exp(y log|x|) (float32: in float64; float64: log in double-double).

    Then the sign for odd integer y and the special cases of C99 Annex F.
    """
    ax = e.abs(x)
    if e.f64:
        l_hi, l_lo = _log_dd(e, ax)
        t_hi = e.mul(y, l_hi)
        t_lo = e.fma(y, l_lo, e.fma(y, l_hi, e.neg(t_hi)))
        t_lo = e.sel(e.cmp("<", e.abs(t_hi), e.c(1e300)), t_lo, e.c(0.0))  # no inf - inf
        mag = _pow_mag_specials(e, ax, y, _exp_core(e, t_hi, t_lo))
    else:
        d = e.with_type(ir.VectorType(ir.DoubleType(), e.lanes) if e.lanes else ir.DoubleType())
        axd, yd = e.b.fpext(ax, d.ty), e.b.fpext(y, d.ty)
        magd = _exp_core(d, d.mul(yd, _log_core(d, axd)))
        mag = e.b.fptrunc(_pow_mag_specials(d, axd, yd, magd), e.ty)
    half = e.mul(y, e.c(0.5))
    odd = e.b.and_(_is_int(e, y), e.cmp("!=", e.floor(half), half))
    res = e.sel(e.b.and_(odd, e.signbit(x)), e.neg(mag), mag)
    neg_fin = e.b.and_(e.cmp("<", x, e.c(0.0)), e.cmp(">", x, e.c(-math.inf)))
    bad = e.b.and_(neg_fin, e.b.and_(e.cmp("!=", e.abs(y), e.c(math.inf)), e.b.not_(_is_int(e, y))))
    res = e.sel(bad, e.c(math.nan), res)
    res = e.sel(e.b.or_(e.isnan(x), e.isnan(y)), e.add(x, y), res)
    one = e.b.or_(e.cmp("==", x, e.c(1.0)), e.cmp("==", y, e.c(0.0)))
    one = e.b.or_(one, e.b.and_(e.cmp("==", x, e.c(-1.0)), e.cmp("==", e.abs(y), e.c(math.inf))))
    return e.sel(one, e.c(1.0), res)


def _pow_mag_specials(e: _Em, ax, y, mag):
    """|x|**y where |x| is 0 or inf (log/exp of infinities) and |x| = 1 with infinite y."""
    inf, zero = e.c(math.inf), e.c(0.0)
    ypos = e.cmp(">", y, zero)
    at_zero = e.sel(ypos, zero, inf)
    at_inf = e.sel(ypos, inf, zero)
    mag = e.sel(e.cmp("==", ax, zero), at_zero, mag)
    mag = e.sel(e.cmp("==", ax, inf), at_inf, mag)
    yinf = e.cmp("==", e.abs(y), inf)
    grow = e.b.xor(e.cmp(">", ax, e.c(1.0)), e.cmp("<", y, zero))  # |x|>1, y=+inf or |x|<1, y=-inf
    return e.sel(yinf, e.sel(grow, inf, zero), mag)


def _sqrt(e: _Em, x):
    return e.intrinsic("sqrt", x)


def _rsqrt(e: _Em, x):
    return e.div(e.c(1.0), e.intrinsic("sqrt", x))


def _floor(e: _Em, x):
    return e.floor(x)


def _ceil(e: _Em, x):
    return e.intrinsic("ceil", x)


def _round_even(e: _Em, x):
    return e.rint(x)


def _abs(e: _Em, x):
    return e.abs(x)


def _sign(e: _Em, x):
    s = e.copysign(e.c(1.0), x)
    s = e.sel(e.cmp("==", x, e.c(0.0)), x, s)
    return e.keep_nan(x, s)


#: op -> (arity, emitter, inline?)  small ones are emitted inline, transcendentals as cached helpers
_RULES: dict[Op, tuple[int, Callable, bool]] = {
    Op.EXP: (1, _exp_core, False),
    Op.EXPM1: (1, _expm1, False),
    Op.LOG: (1, _log, False),
    Op.LOG1P: (1, _log1p, False),
    Op.TANH: (1, _tanh, False),
    Op.LOGISTIC: (1, _logistic, False),
    Op.SINE: (1, _sine, False),
    Op.COSINE: (1, _cosine, False),
    Op.ERF: (1, _erf, False),
    Op.POWER: (2, _power, False),
    Op.ATAN2: (2, _atan2, False),
    Op.SQRT: (1, _sqrt, True),
    Op.RSQRT: (1, _rsqrt, True),
    Op.FLOOR: (1, _floor, True),
    Op.CEIL: (1, _ceil, True),
    Op.ROUND_NEAREST_EVEN: (1, _round_even, True),
    Op.ABS: (1, _abs, True),
    Op.SIGN: (1, _sign, True),
}

#: ops `emit_math` supports
SUPPORTED_OPS = frozenset(_RULES)

#: documented max error in ulps (float32, float64) over the whole input range, measured against long double
#: references (erf float64: against libm's double erf); tests/cpu/test_vecmath.py asserts these.  POWER float64:
#: for |y ln|x|| up to ~300; near overflow/underflow (|y ln|x|| up to 709) the bound is `POWER_F64_EXTREME_ULP`.
ULP_BOUNDS: dict[Op, tuple[float, float]] = {
    Op.EXP: (1, 1), Op.EXPM1: (2, 2), Op.LOG: (1, 1), Op.LOG1P: (1, 1), Op.SQRT: (0.5, 0.5),
    Op.RSQRT: (1.5, 1.5), Op.TANH: (3, 3), Op.LOGISTIC: (2, 2), Op.SINE: (1.5, 1.5), Op.COSINE: (1.5, 1.5),
    Op.ERF: (2.5, 2), Op.ATAN2: (2.5, 2.5), Op.POWER: (1, 8),
}
POWER_F64_EXTREME_ULP = 24
#: |x| (float32, float64) up to which SINE/COSINE keep their bound; beyond it the Cody-Waite reduction loses
#: bits (float32: ~200 ulp up to 1e7, then garbage), results are clamped to [-1, 1]; inf -> NaN.
TRIG_ACCURATE_RANGE = (2.0**20, 2.0**49)


def _call_helper(e: _Em, op: Op, args: list):
    """Call (creating once per module) the internal helper `hlotune_<op>_<type>`."""
    module = e.b.block.function.module
    name = f"hlotune_{op.name.lower()}_{e.suffix}"
    try:
        fn = module.get_global(name)
    except KeyError:
        arity, emitter, _ = _RULES[op]
        fn = ir.Function(module, ir.FunctionType(e.ty, [e.ty] * arity), name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        inner = ir.IRBuilder(fn.append_basic_block("entry"))
        inner.ret(emitter(_Em(inner, e.ty), *fn.args))
    return e.b.call(fn, args)


def _check_type(ty: ir.Type, op: Op) -> None:
    elem = ty.element if isinstance(ty, ir.VectorType) else ty
    if not isinstance(elem, (ir.FloatType, ir.DoubleType)):
        raise UnsupportedError(f"vector math supports float/double scalars or vectors, got {ty}", op=str(op))
    if isinstance(ty, ir.VectorType) and not 1 <= ty.count <= 16:
        raise UnsupportedError(f"vector math supports 1..16 lanes, got {ty.count}", op=str(op))


def emit_math(builder: ir.IRBuilder, op: Op, args: list[ir.Value]) -> ir.Value:
    """Emit `op(*args)` at the builder's position; returns a value of the arguments' type.

    Arguments: `float`/`double` scalars or `<N x float>`/`<N x double>` vectors (N in 1..16), all of
    one type (two for POWER and ATAN2 (y, x), one otherwise).  Transcendentals become calls to
    internal `alwaysinline` helper functions cached per module (inlined by any -O pipeline); the
    cheap ops (sqrt, rsqrt, floor, ceil, round-nearest-even, abs, sign) are emitted inline.
    """
    if op not in _RULES:
        raise UnsupportedError(f"no vector math rule for {op}", op=str(op))
    arity, emitter, inline = _RULES[op]
    if len(args) != arity or any(a.type != args[0].type for a in args):
        raise UnsupportedError(f"{op} takes {arity} arguments of one type, got {[str(a.type) for a in args]}",
                               op=str(op))
    _check_type(args[0].type, op)
    e = _Em(builder, args[0].type)
    return emitter(e, *args) if inline else _call_helper(e, op, list(args))
