"""Loop IR -> CUDA C source (one or more `__global__` kernels per LoopFunc).

Map:
  generate_cuda(func, arch) LoopFunc -> CudaSource (text, launches in order, global temporaries)
  CudaSource / Launch       what the runtime needs: kernel names, grid/block, shared bytes, parameters
  _split_kernels            the root of a LoopFunc: Allocates outside every nest become global temporaries
                            (device workspace); each root nest (a Seq child) becomes its own kernel,
                            launched in order (a stage's results are then visible to the next one)
  _KernelPlan               per kernel: launch extents, loop checks, local->shared promotion, barriers
  _insert_sync              __syncthreads() placement (read-after-write and write-after-read of shared
                            buffers between uniform program points; loop-carried hazards via two passes)
  _scalarize                scalar replacement: inside a thread loop, a kernel buffer (or global temporary)
                            used at one loop-invariant element (an rfactor partial) lives in a register
  _gemm_info / gemm_text    the GEMM template: a K-tile loop proven (by evaluating its index expressions) to be the
                            tiled dot of the default schedule becomes shared tiles filled by a 3-stage cp.async ring
                            (A row-major; `GEMM_STAGES`, `GEMM_A_ROW`) or, for 16-row register tiles and 8-row ones in
                            small grids, double-buffered float4 register prefetch (A transposed), one barrier per K
                            tile (`GEMM_TEMPLATE`); FFMA tilings of 8x16 / 16x8 per thread on 256 threads take the
                            `cuda_simt` template (`GEMM_SIMT`: a K loop in quads, the tile exchanged through shared
                            memory, one block per SM, grouped block rasterization through `_kernel_raster`); every
                            template's shared memory within the arch's limit (`_shared_cap`)
  _gemm_mma_text            the GEMM template on tensor cores, chosen by the schedule (a ("tensor_core", 3) pragma on
                            the K-tile loop, where the tiling fits: `_mma_fits`): 3xTF32 mma.sync m16n8k8 (float32-
                            class error), the loop nest's accumulators used directly as the mma C fragments (TJ = 4
                            makes a warp's 8 x 4 thread grid the fragment's lane grid); `mma_index_exprs` gives its
                            index expressions (emulated on the CPU by tests/null/test_cuda_mma.py); on sm_90 for
                            the tilings `cuda_wgmma.wgmma_fits` takes (`GEMM_WGMMA`): 3xTF32 on wgmma (sm_90a), the
                            `cuda_wgmma` template (emulated by tests/null/test_cuda_wgmma.py)
  _igemm_info / igemm_text  the implicit-GEMM template: a register-tiled K-tile loop without shared stages whose
                            operands are proven to depend on the thread only through tid / TJ (A) and tid % TJ (B)
                            (a conv reading through an inlined pad, NT / TN dots) gets cooperative shared tiles
                            evaluated from the operand expressions themselves (float4 where `_lane_form` proves it,
                            affine offsets where evaluation proves them), double-buffered (`IGEMM_TEMPLATE`);
                            `igemm_loop_nest` writes what it computes as loop IR (CPU checks)
  _vector_access            affine lane analysis: float4/float2 accesses of a VECTORIZED loop (`vector_store`)
  _Emitter                  statements and expressions -> C text (helpers in PRELUDE); a serial combine loop
                            `B[I] = B[I] op E(v)` at a uniform point (what thread 0 alone would run) becomes
                            a cross-thread reduction: strided per-thread partials, warp shuffles, one shared
                            slot per warp (`cross_thread_reduce`); in a block of one warp per threadIdx.y row, warp
                            shuffles only (a thread-local B: a butterfly all-reduce, every lane gets the total)
  _lane_private             a row buffer that each lane of a one-row-per-threadIdx.y block (32 lanes; 64 / 128: two /
                            four warps per row, `LANE_REGISTERS_WIDE`) only touches at its own elements stays in
                            registers (`LANE_REGISTERS`) instead of shared memory; barriers of such wide rows are a
                            named barrier per row (`ROW_BARRIERS`), their all-reduces read all the row's partials in
                            every warp; `_Emitter.row_prefetch`:
                            K rows per warp with the next row's register fill issued first (`ROW_PREFETCH`)
  _float_math               float32 exp / sin / cos of the prelude (bounds `FLOAT_MATH_ULP`; sin / cos select
                            between both polynomials, `SIN_SELECT`)
  hl_fdiv_row               division by a row's scalar (`ROW_DIV_RCP`) or an expression of them (`ROW_DIV_EXPR`:
                            layernorm's sqrt) via one reciprocal per row + Markstein's correction, exact inside a
                            range guard (`ROW_DIV_GROUPED`: one guard per float4; all on since session 7b)
  _grid_stride              optional grid-stride block loop (`GRID_STRIDE_BLOCKS`)
  _merge_small              consecutive small kernels of one function joined into one, a barrier between them
                            (`MERGE_SMALL_KERNELS`)

Semantics (the same as the CPU backend, `llvm_emit`):
- A loop bound to blockIdx.* / threadIdx.* runs its iterations in parallel: the variable is the hardware
  index; the launch extent of an axis is the largest loop bound to it in the kernel, and a smaller loop is
  guarded (`if (threadIdx.x < n)`), unless it contains a barrier (then the extents must agree:
  CompileError).  Two nested loops on one blockIdx axis are rejected; nested loops on one threadIdx axis
  are allowed only when the inner nest writes shared buffers (a cooperative fetch, whose region the
  lowering relaxes over the outer thread loops).
- A store to a shared or global buffer outside the loops of some launched thread (block) axis runs in
  thread (block) 0 of that axis only, so the sequential meaning is kept (e.g. the final combine of
  rfactor partials).  Local buffers are per thread; a local buffer allocated outside a thread loop and
  written inside one is promoted to shared memory (its elements are written by different threads), one copy
  per thread of the thread axes already bound where it is allocated; unless every lane of a one-warp-per-row
  block only touches its own elements of it (`_lane_private`): then each lane keeps them in registers.
- VTHREAD loops are unrolled serial loops (no interleaving yet); PARALLEL loops are serial inside a kernel;
  a VECTORIZED loop of 2 or 4 float32 stores at consecutive aligned elements is one float2/float4 store (with
  vector loads of the inputs read alike); other VECTORIZED and UNROLLED loops get `#pragma unroll`, and a
  serial loop under an `auto_unroll_max_step` pragma too when its fully unrolled size (stores executed) is
  within the pragma.
- Shared buffers are declared at kernel scope (static up to 48 KB in total, dynamic beyond); barriers are
  only placed at uniform points (not under a thread-dependent `If` or a guarded thread loop).
- Float arithmetic: nvcc's default (IEEE division and square root, FMA contraction like LLVM's `contract`);
  max/min propagate NaN; compares are ordered except NE; float->int converts saturate (NaN -> 0); integer
  division follows HLO (x/0 = -1, x%0 = x, MIN/-1 = MIN); bf16 lives in float registers and memory and is
  rounded (nearest even) after every operation; f16 is `__half` in memory, float in registers, rounded back
  after every operation.
- Transcendentals (bounds of `vecmath.ULP_BOUNDS`): CUDA's float functions are used where their documented
  maximum error is within the CPU bound (expm1f, logf, log1pf, sqrtf, tanhf, erff); float32 exp, sin and cos are
  our own (`_float_math`: float polynomials, sin / cos with a double Cody-Waite reduction; `FLOAT_MATH_ULP`,
  checked on the GPU); rsqrt, logistic, atan2 and pow of float32 are evaluated in double and rounded (CUDA's
  float versions are documented at 2-4 ulp, over the bound).  float64 uses CUDA's double functions (sin/cos:
  2 ulp documented against a 1.5 ulp CPU bound).
- Blocks of one warp per threadIdx.y row whose shared buffers all have one copy per row synchronize with
  `__syncwarp` (`_KernelPlan.warp_private`); a thread-local combine of per-lane partials there is a butterfly warp
  all-reduce.  `GRID_STRIDE_BLOCKS` (off) turns the block loop of shared-memory-free kernels into a grid-stride
  loop.
- Index arithmetic is 32-bit when every buffer and loop extent is below 2**30, else 64-bit.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import re
import struct
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..errors import CompileError
from ..ir.expr import (
    INDEX,
    Binary,
    Cast,
    Compare,
    Const,
    Expr,
    Load,
    Select,
    Unary,
    Var,
    children,
    rebuild,
    substitute,
    walk,
)
from ..ir.hlo import DType, Op
from ..schedule_space.loop_ir import (
    Allocate,
    Barrier,
    BufferDecl,
    For,
    ForKind,
    If,
    LoopFunc,
    Seq,
    Stmt,
    Store,
    walk_stmts,
)
from ..target import cuda_cc, cuda_shared_limit
from .cuda_simt import simt_fits, simt_raster, simt_shared_bytes, simt_stages, simt_text
from .cuda_wgmma import wgmma_fits, wgmma_prelude, wgmma_shared_bytes, wgmma_stages, wgmma_text

STATIC_SHARED_LIMIT = 48 * 1024

_BLOCK = {ForKind.BLOCK_X: 0, ForKind.BLOCK_Y: 1, ForKind.BLOCK_Z: 2}
_THREAD = {ForKind.THREAD_X: 0, ForKind.THREAD_Y: 1, ForKind.THREAD_Z: 2}
_AXIS = "xyz"

_CTYPE = {DType.PRED: "bool", DType.S8: "signed char", DType.U8: "unsigned char", DType.S32: "int",
          DType.U32: "unsigned int", DType.S64: "long long", DType.F16: "__half", DType.BF16: "float",
          DType.F32: "float", DType.F64: "double"}
_BYTES = {DType.PRED: 1, DType.S8: 1, DType.U8: 1, DType.S32: 4, DType.U32: 4, DType.S64: 8,
          DType.F16: 2, DType.BF16: 4, DType.F32: 4, DType.F64: 8}
_UNSIGNED = {DType.S8: "unsigned char", DType.S32: "unsigned int", DType.S64: "unsigned long long"}
_INT_RANGE = {DType.S8: (-128, 127), DType.U8: (0, 255), DType.S32: (-(2 ** 31), 2 ** 31 - 1),
              DType.U32: (0, 2 ** 32 - 1), DType.S64: (-(2 ** 63), 2 ** 63 - 1)}
_CMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}

PRELUDE = r"""
#define HL_INL __device__ __forceinline__
HL_INL float hl_bf16(float v) {
  unsigned b = __float_as_uint(v);
  if (v != v) return __uint_as_float((b & 0xffff0000u) | 0x00400000u);
  return __uint_as_float((b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u);
}
HL_INL float hl_f16(float v) { return __half2float(__float2half_rn(v)); }
template <typename T> HL_INL T hl_fmax(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> HL_INL T hl_fmin(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> HL_INL T hl_imax(T a, T b) { return a > b ? a : b; }
template <typename T> HL_INL T hl_imin(T a, T b) { return a < b ? a : b; }
template <typename T> HL_INL T hl_sdiv(T a, T b, T mn) {
  return b == 0 ? (T)-1 : (b == (T)-1 && a == mn) ? mn : (T)(a / b); }
template <typename T> HL_INL T hl_srem(T a, T b) { return b == 0 ? a : b == (T)-1 ? (T)0 : (T)(a % b); }
template <typename T> HL_INL T hl_udiv(T a, T b) { return b == 0 ? (T)~(T)0 : (T)(a / b); }
template <typename T> HL_INL T hl_urem(T a, T b) { return b == 0 ? a : (T)(a % b); }
template <typename T> HL_INL T hl_f2i(double x, double lo, double hi, T tlo, T thi) {
  return x != x ? (T)0 : x <= lo ? tlo : x >= hi ? thi : (T)x; }
template <typename T, typename U> HL_INL T hl_ipow(T a, T e, bool is_signed) {
  T r = 1, b = a; U ex = (U)e;
  for (int i = 0; i < (int)(sizeof(T) * 8); ++i) { if (ex & 1) r = (T)(r * b); b = (T)(b * b); ex >>= 1; }
  if (is_signed && e < 0) return a == (T)1 ? (T)1 : a == (T)-1 ? ((e & 1) ? (T)-1 : (T)1) : (T)0;
  return r; }
template <typename T> HL_INL T hl_fsign(T x) { return x > (T)0 ? (T)1 : x < (T)0 ? (T)-1 : x; }
HL_INL double hl_exp(double x) { return exp(x); }
HL_INL float hl_expm1(float x) { return expm1f(x); }
HL_INL double hl_expm1(double x) { return expm1(x); }
HL_INL float hl_log(float x) { return logf(x); }
HL_INL double hl_log(double x) { return log(x); }
HL_INL float hl_log1p(float x) { return log1pf(x); }
HL_INL double hl_log1p(double x) { return log1p(x); }
HL_INL float hl_sqrt(float x) { return sqrtf(x); }
HL_INL double hl_sqrt(double x) { return sqrt(x); }
HL_INL float hl_rsqrt(float x) { return (float)(1.0 / sqrt((double)x)); }
HL_INL double hl_rsqrt(double x) { return rsqrt(x); }
HL_INL float hl_tanh(float x) { return tanhf(x); }
HL_INL double hl_tanh(double x) { return tanh(x); }
HL_INL float hl_logistic(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }
HL_INL double hl_logistic(double x) { return 1.0 / (1.0 + exp(-x)); }
HL_INL double hl_sin(double x) { return sin(x); }
HL_INL double hl_cos(double x) { return cos(x); }
HL_INL float hl_erf(float x) { return erff(x); }
HL_INL double hl_erf(double x) { return erf(x); }
HL_INL float hl_atan2(float a, float b) { return (float)atan2((double)a, (double)b); }
HL_INL double hl_atan2(double a, double b) { return atan2(a, b); }
HL_INL float hl_pow(float a, float b) { return (float)pow((double)a, (double)b); }
HL_INL double hl_pow(double a, double b) { return pow(a, b); }
"""


def _hex(v: float, f32: bool = True) -> str:
    """A C hexadecimal literal of the float32 (suffix f) or float64 value nearest `v` (exact)."""
    if f32:
        v = _f32(v)
    return ("-" if math.copysign(1.0, v) < 0 else "") + abs(v).hex() + ("f" if f32 else "")


def _f32(v) -> float:
    """The float32 nearest the exact value `v` (a Fraction or float), as a Python float."""
    v = Fraction(v)
    c = float(v)
    cands = {float(struct.unpack("f", struct.pack("f", c))[0])}
    for d in (-1, 1):   # neighbours of the (double-rounded) candidate: keep the nearest to the exact value
        b = struct.unpack("I", struct.pack("f", next(iter(cands))))[0]
        cands.add(struct.unpack("f", struct.pack("I", (b + d) & 0xffffffff))[0])
    return min((x for x in cands if math.isfinite(x)), key=lambda x: abs(Fraction(x) - v))


def _float_math(float_reduction: bool = False, huge_call: bool = False, select: bool | None = None) -> str:
    """float32 exp, sin and cos without the FP64 library's slow paths (bounds: `FLOAT_MATH_ULP`).

    exp: clamp to [-104, 89], n = rint(x log2 e), r = x - n ln2 (two-part Cody-Waite, the first part 16 bits so
    n * hi is exact), Taylor polynomial of degree 7 on |r| <= ln2/2 in fma Horner form, times 2^(n/2) twice
    (the first product exact, one rounding to a denormal or inf).
    sin / cos: k = nearest integer of x 2/pi (through the 1.5 * 2^52 shifter, which also gives k mod 4 in its
    low word), r = x - k pi/2 in double with pi/2 split in two doubles (the first fma is exact for every float32
    |x| < 2^30, the tail error is below 2^-75), r rounded to float plus its rounding error rl; sin(r + rl) =
    r + (r^3 S(r^2) + rl), cos(r + rl) = 1 + (r^2 C(r^2) - r rl), Taylor S / C of degrees 9 / 10 on |r| <= pi/4
    (a little more with the float reduction: k from a float product).  |x| >= 2^30 (and inf / NaN) take CUDA's
    double sin / cos (`huge_call`: through a non-inlined function).  `float_reduction`: |x| < 2^17 reduce in
    float alone: pi/2 = p1 + p2 + p3 (float32 parts), x - k p1 exact (fma), k p2 as an exact pair (fma; the
    product through __fmul_rn so that nvcc does not contract it into the TwoSum), a TwoSum, k p3 into the tail.
    `select`: both polynomials evaluated and the quadrant's one selected (no branch; the same values); None: the
    module's SIN_SELECT.
    """
    select = SIN_SELECT if select is None else select
    pi, ln2 = _PI_EXACT, _LN2_EXACT
    l_hi = _hi_bits(ln2, 16)
    pio2_hi = float(pi / 2)
    pio2_lo = float(pi / 2 - Fraction(pio2_hi))
    p1 = _f32(pi / 2)
    p2 = _f32(pi / 2 - Fraction(p1))
    p3 = _f32(pi / 2 - Fraction(p1) - Fraction(p2))
    exp_c = [Fraction(1, math.factorial(k)) for k in range(8)]
    sin_c = [Fraction((-1) ** (k + 1), math.factorial(2 * k + 3)) for k in range(4)]
    cos_c = [Fraction((-1) ** (k + 1), math.factorial(2 * k + 2)) for k in range(5)]

    def horner(coeffs, var):
        acc = _hex(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = f"fmaf({acc}, {var}, {_hex(c)})"
        return acc

    k_text = f"const float k = rintf(x * {_hex(2 / pi)})"
    vc = f"1.0f + fmaf(z, {horner(cos_c, 'z')}, -r * rl)"
    vs = f"r + fmaf(r * z, {horner(sin_c, 'z')}, rl)"
    quadrant = (f"  const float vc = {vc};\n  const float vs = {vs};\n  float v = (q & 1) ? vc : vs;" if select else
                f"  float v;\n  if (q & 1) v = {vc};\n  else v = {vs};")
    huge_fn = ("__device__ __noinline__ float hl_sincos_huge(float x, int cosine) {\n"
               "  return cosine ? (float)cos((double)x) : (float)sin((double)x);\n}\n") if huge_call else ""
    return f"""
HL_INL float hl_exp(float x) {{
  if (x != x) return x;
  const float xc = fminf(fmaxf(x, -104.0f), 89.0f);
  const float n = rintf(xc * {_hex(1 / ln2)});
  float r = fmaf(-n, {_hex(l_hi)}, xc);
  r = fmaf(-n, {_hex(ln2 - Fraction(l_hi))}, r);
  const float p = {horner(exp_c, "r")};
  const int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;
  return p * __int_as_float((n1 + 127) << 23) * __int_as_float((n2 + 127) << 23);
}}
{huge_fn}HL_INL float hl_sincosf(float x, int cosine) {{
  float r, rl;
  int q;
  if ({"fabsf(x) < 131072.0f" if float_reduction else "false"}) {{   // float: x - k (p1 + p2 + p3) as the pair r + rl
    {k_text};
    const float r1 = fmaf(-k, {_hex(p1)}, x);
    const float th = __fmul_rn(k, {_hex(p2)});   // never contracted into the subtractions below
    const float tl = fmaf(k, {_hex(p2)}, -th);
    const float s = r1 - th;
    const float bv = s - r1;
    const float e = (r1 - (s - bv)) - (th + bv);
    const float lo = fmaf(-k, {_hex(p3)}, e - tl);
    r = s + lo;
    rl = lo - (r - s);
    q = ((int)k + cosine) & 3;
  }} else if (fabsf(x) < 1073741824.0f) {{   // double: exact first step up to 2^30
    const double xd = (double)x;
    const double t = fma(xd, {_hex(float(2 / pi), False)}, 6755399441055744.0);
    const double k = t - 6755399441055744.0;
    double rd = fma(-k, {_hex(pio2_hi, False)}, xd);
    rd = fma(-k, {_hex(pio2_lo, False)}, rd);
    r = (float)rd;
    rl = (float)(rd - (double)r);
    q = (__double2loint(t) + cosine) & 3;
  }} else {{
    return {"hl_sincos_huge(x, cosine)" if huge_call else "cosine ? (float)cos((double)x) : (float)sin((double)x)"};
  }}
  const float z = r * r;
{quadrant}
  v = (q & 2) ? -v : v;
  return (x == 0.0f && !cosine) ? x : v;
}}
HL_INL float hl_sin(float x) {{ return hl_sincosf(x, 0); }}
HL_INL float hl_cos(float x) {{ return hl_sincosf(x, 1); }}
"""


_PI_EXACT = Fraction("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899863")
_LN2_EXACT = Fraction("0.693147180559945309417232121458176568075500134360255254120680009493393621969694715605")
#: maximum error (ulp of the float32 result, against the exact value) of the float32 functions of `_float_math`:
#: the documented bound, checked on the GPU against numpy float64 (tests/gpu/test_cuda_run.py); the CPU's bounds
#: (vecmath.ULP_BOUNDS) are 1 for exp and 1.5 for sin / cos.
FLOAT_MATH_ULP = {Op.EXP: 1.0, Op.SINE: 1.5, Op.COSINE: 1.5}


def _hi_bits(v: Fraction, bits: int) -> float:
    e = math.frexp(float(v))[1]
    scale = Fraction(2) ** (bits - e)
    return float(Fraction(round(v * scale)) / scale)


#: sin / cos variants: the float reduction for |x| < 2^17, the double library call for |x| >= 2^30 out of line.
#: Off by default: on the H200, sin_mul_add ran at 38.5 us with neither against 39.3 us with both (the double
#: reduction's four conversions are not what limits the kernel); the float reduction is kept, tested, for GPUs
#: with a slow FP64 pipe.
SIN_FLOAT_REDUCTION = False
SIN_HUGE_CALL = False
#: session 6 (`_float_math`): both polynomials and a select instead of the quadrant branch (on by default: the same
#: values bit for bit, sin_mul_add 38.3 -> 37.6 us on the H200)
SIN_SELECT = True
_SIN_DEFAULTS = (SIN_FLOAT_REDUCTION, SIN_HUGE_CALL, SIN_SELECT)
_PRELUDE_BASE = PRELUDE
PRELUDE += _float_math(*_SIN_DEFAULTS)


def _prelude() -> str:
    """PRELUDE, or its variant for the current SIN_* settings."""
    flags = (SIN_FLOAT_REDUCTION, SIN_HUGE_CALL, SIN_SELECT)
    if flags == _SIN_DEFAULTS:
        return PRELUDE
    return _PRELUDE_BASE + _float_math(*flags)

_MATH = {Op.EXP: "hl_exp", Op.EXPM1: "hl_expm1", Op.LOG: "hl_log", Op.LOG1P: "hl_log1p", Op.SQRT: "hl_sqrt",
         Op.RSQRT: "hl_rsqrt", Op.TANH: "hl_tanh", Op.LOGISTIC: "hl_logistic", Op.SINE: "hl_sin",
         Op.COSINE: "hl_cos", Op.ERF: "hl_erf", Op.ATAN2: "hl_atan2", Op.POWER: "hl_pow"}


@dataclass(frozen=True)
class Launch:
    """One `__global__` kernel of a CudaSource and how to launch it."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int            # static + dynamic
    dynamic_shared_bytes: int    # to pass at launch (0 when all shared memory is static)
    params: tuple[str, ...]      # buffer names, in argument order

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class CudaSource:
    """The CUDA C text of a LoopFunc: kernels launched in order over the function's buffers and the
    global temporaries (`temps`, device workspace allocated by the runtime)."""

    func: LoopFunc
    text: str
    launches: tuple[Launch, ...]
    temps: tuple[BufferDecl, ...]
    index_bits: int


def ctype(dt: DType) -> str:
    """The C type of one element of a buffer of `dt` in memory."""
    return _CTYPE[dt]


def _reg(dt: DType) -> str:
    return "float" if dt in (DType.F16, DType.BF16) else _CTYPE[dt]


def sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "k"
    return s if not s[0].isdigit() else "k_" + s


# ----------------------------------------------------------------------------- splitting into kernels

def _split_kernels(body: Stmt, temps: list[Allocate], top: bool = True) -> list[Stmt]:
    """Root nests (children of the root Seq, under the root Allocates) -> kernels."""
    if isinstance(body, Seq) and top:
        out: list[Stmt] = []
        for s in body.body:
            out += _split_kernels(s, temps, False)
        return out
    if isinstance(body, Allocate):
        temps.append(body)
        return _split_kernels(body.body, temps, top)
    return [body]


def _vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def _stmt_loads(s: Stmt) -> set[str]:
    exprs: list[Expr] = []
    if isinstance(s, Store):
        exprs = [*s.indices, s.value]
    elif isinstance(s, If):
        exprs = [s.cond]
    elif isinstance(s, For):
        exprs = [s.min, s.extent]
    return {n.buffer for e in exprs for n in walk(e) if isinstance(n, Load)}


def _accesses(s: Stmt) -> tuple[set[str], set[str]]:
    """(buffers read, buffers written) anywhere in `s`."""
    r: set[str] = set()
    w: set[str] = set()
    for x in walk_stmts(s):
        r |= _stmt_loads(x)
        if isinstance(x, Store):
            w.add(x.buffer)
    return r, w


def unroll_size(s: Stmt) -> float:
    """Stores executed if `s` were fully unrolled; inf if not constant."""
    if isinstance(s, Store):
        return 1
    if isinstance(s, Seq):
        return sum(unroll_size(x) for x in s.body)
    if isinstance(s, If):
        return unroll_size(s.then) + (unroll_size(s.otherwise) if s.otherwise is not None else 0)
    if isinstance(s, Allocate):
        return unroll_size(s.body)
    if isinstance(s, For):
        n = s.const_extent
        if n is None:
            return math.inf
        if s.kind in _BLOCK or s.kind in _THREAD:
            return unroll_size(s.body)
        return unroll_size(s.body) * n
    return 0


# ----------------------------------------------------------------------------- per-kernel analysis

@dataclass
class _KernelPlan:
    grid: list[int] = field(default_factory=lambda: [1, 1, 1])
    block: list[int] = field(default_factory=lambda: [1, 1, 1])
    shared: dict[str, Allocate] = field(default_factory=dict)   # shared (and promoted) allocations
    thread_vars: set[str] = field(default_factory=set)
    #: promoted buffer -> the thread axes bound where it is allocated: one copy per thread of those axes
    replicas: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: blockIdx.x extent of the loop nest when the kernel runs a grid-stride loop over it on `grid[0]` blocks
    stride_x: int = 0
    #: lane-private buffers kept in registers (`_lane_private`): buffer -> (lane stride s, threadIdx.x loop vars)
    lane_regs: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)

    @property
    def warp_private(self) -> bool:
        """Blocks of one warp per threadIdx.y row whose every shared buffer has one copy per row: a warp only
        touches its own copies, so its barriers need only synchronize the warp (`__syncwarp`)."""
        rows = (1,) if self.block[1] > 1 else ()
        return (WARP_BARRIERS and self.block[0] == 32 and self.block[2] == 1
                and all(self.replicas.get(b, ()) == rows for b in self.shared))

    @property
    def row_barrier(self) -> bool:
        """Blocks of several warps per threadIdx.y row (64 or more lanes: two or more warps per row) whose every
        shared buffer has one copy per row: a barrier need only synchronize the row's warps, a named barrier per row
        (`bar.sync threadIdx.y, block[0]`; at most 16 rows, every barrier of the kernel one of these)."""
        return (ROW_BARRIERS and self.block[0] > 32 and self.block[0] % 32 == 0 and self.block[2] == 1
                and 1 < self.block[1] <= 16 and all(self.replicas.get(b, ()) == (1,) for b in self.shared))

    @property
    def lanes(self) -> int:
        """Lanes of a row in a block of one row per threadIdx.y (32: one warp per row; 64, 128: two, four)."""
        return self.block[0]

    def copies(self, buf: str) -> int:
        return math.prod(self.block[a] for a in self.replicas.get(buf, ()))


def _const_extent(f: For) -> int:
    n = f.const_extent
    if n is None or not (isinstance(f.min, Const) and f.min.value == 0):
        raise CompileError(f"GPU-bound loop {f.var.name} needs min 0 and a constant extent")
    return int(n)


def _plan(kernel: Stmt, name: str) -> _KernelPlan:
    p = _KernelPlan()

    def visit(s: Stmt, bound_b: set[int], bound_t: set[int]) -> None:
        if isinstance(s, For):
            if s.kind in _BLOCK:
                ax = _BLOCK[s.kind]
                if ax in bound_b:
                    raise CompileError(f"kernel {name}: loop {s.var.name} is bound to {s.kind.value} inside "
                                       f"another loop bound to it")
                p.grid[ax] = max(p.grid[ax], _const_extent(s))
                return visit(s.body, bound_b | {ax}, bound_t)
            if s.kind in _THREAD:
                ax = _THREAD[s.kind]
                if ax in bound_t:
                    _, w = _accesses(s.body)
                    local = {a.buffer for a in walk_stmts(kernel) if isinstance(a, Allocate) and a.scope == "local"}
                    if w & local or any(x in w for x in _outputs_of(kernel)):
                        raise CompileError(f"kernel {name}: loop {s.var.name} is bound to {s.kind.value} inside "
                                           f"another loop bound to it, and writes more than shared buffers")
                p.block[ax] = max(p.block[ax], _const_extent(s))
                p.thread_vars.add(s.var.name)
                return visit(s.body, bound_b, bound_t | {ax})
            return visit(s.body, bound_b, bound_t)
        if isinstance(s, Allocate) and s.scope == "shared":
            p.shared[s.buffer] = s
        for c in _children(s):
            visit(c, bound_b, bound_t)

    visit(kernel, set(), set())
    _promote_locals(kernel, p)
    return p


def _outputs_of(kernel: Stmt) -> set[str]:
    """Buffers written in `kernel` that are not allocated inside it (outputs and global temporaries)."""
    _, w = _accesses(kernel)
    inside = {a.buffer for a in walk_stmts(kernel) if isinstance(a, Allocate)}
    return w - inside


def _children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, For | Allocate):
        return (s.body,)
    if isinstance(s, Seq):
        return s.body
    if isinstance(s, If):
        return (s.then,) if s.otherwise is None else (s.then, s.otherwise)
    return ()


def _promote_locals(kernel: Stmt, p: _KernelPlan) -> None:
    """A local buffer allocated outside a thread loop (of a launched axis) and written inside it holds
    elements of several threads: it goes to shared memory, one copy per thread of the axes already bound where
    it is allocated (e.g. one per threadIdx.y row of a block whose warps each reduce a row)."""
    def visit(s: Stmt, bound_t: frozenset[int]) -> None:
        if isinstance(s, Allocate) and s.scope != "shared" and s.buffer not in p.shared:
            if _written_under_new_thread_axis(s.body, s.buffer, bound_t, p):
                lane = _lane_private(s, p)
                if lane is not None:
                    p.lane_regs[s.buffer] = lane
                    for c in _children(s):
                        visit(c, bound_t)
                    return
                p.shared[s.buffer] = s
                rep = tuple(sorted(a for a in bound_t if p.block[a] > 1))
                if rep:
                    p.replicas[s.buffer] = rep
        if isinstance(s, For) and s.kind in _THREAD:
            bound_t = bound_t | {_THREAD[s.kind]}
        for c in _children(s):
            visit(c, bound_t)
    visit(kernel, frozenset())


#: a row buffer that every lane of a one-warp-per-row block only touches at its own elements (each access inside a
#: threadIdx.x loop at flat index s * lane + f, f % (32 s) < s, the same s everywhere: softmax's row and its exp
#: under the row-register schedule) stays in registers, N / 32 per lane, instead of going to shared memory
LANE_REGISTERS = True
LANE_REGISTERS_MAX = 64     # most registers per lane such a buffer may take (else it goes to shared memory)
#: the same for rows of 64 / 128 lanes (two / four warps per row: the schedule's "row_lanes")
LANE_REGISTERS_WIDE = True


#: the row-register schedule's unrolled loop over a warp's rows: the next row's lane-register fill issued before
#: the current row's work (`_Emitter.row_prefetch`)
ROW_PREFETCH = True
ROW_PREFETCH_UNROLL = True    # the row loop unrolled (False: a rolled loop, nothing hoisted across rows)
#: float32 division by a row's scalar (a size-1 local of a row-register kernel: softmax's sum) through one reciprocal
#: per row and Markstein's correction (`hl_fdiv_row`, exactly the IEEE quotient inside its range guard; on since
#: session 7b, with ROW_DIV_GROUPED: softmax 4096 x 1024 10.2 -> 9.1 us on the H200)
ROW_DIV_RCP = True
#: with ROW_DIV_RCP / ROW_DIV_EXPR, float4 stores take the correction for their four quotients, one guard for all four
#: (`hl_fdiv_fast`, `hl_div_ok`; the four recomputed by division when any is outside it): one branch per float4
ROW_DIV_GROUPED = True
#: a float32 division by an expression of a row's scalars and constants (layernorm's sqrt(var / n + eps), the same
#: for every element of the row) through `hl_fdiv_row` too (nvcc evaluates the expression, its reciprocal and the
#: divisor's half of the range guard once per row; on since session 7b: layernorm 8192 x 1024 21.0 -> 20.3 us)
ROW_DIV_EXPR = True
#: vectorized global loads of inputs at least as large as the buffer stored (read once: `_streamed`) and vectorized
#: global stores with the streaming cache hint (`__ldcs` / `__stcs`, evict first) instead of plain loads and stores;
#: smaller inputs (a row's scale, a broadcast bias: read by many blocks) stay plain.  H200, session 8, two calls, 9
#: rounds interleaved (logs/gpu_s8k/call1, logs/gpu_s8/final2): layernorm x0.943-0.961 (20.1 -> 19.0-19.3 us, 82-83 %
#: of copy), relu_chain x0.970 (89 %), gelu_tanh x0.971-0.972 (94 %), sin_mul_add x0.972-0.981, softmax and row_sum
#: level; the same bits.  Off: plain loads and stores
STREAM_HINTS = True


def _streamed(src: BufferDecl, dst: BufferDecl) -> bool:
    """A global input read once per element of the stored buffer (at least as many elements): a streaming load."""
    return src.scope == "global" and math.prod(src.shape) >= math.prod(dst.shape)


#: hl_fdiv_row: y = RN(1/b) (`__frcp_rn`, the same for every element of the row: nvcc computes it once), q = RN(a y),
#: r = a - q b (exact: one fma), RN(q + r y) is the correctly rounded a / b (Markstein's theorem) when no step under- or
#: overflows: |b| in [2^-24, 2^24] and |a| in [2^-54, 2^100] (then q >= 2^-78 and the remainder, a multiple of
#: ulp(q) ulp(b) >= 2^-149, is representable; |q| < 2^126).  Else (zeros: -0 / b would give +0; inf, NaN) the
#: division.  Checked bit for bit against the division on the CPU (tests/null/test_cuda_rows7.py).
ROW_DIV_PRELUDE = r"""
HL_INL float hl_fdiv_row(float a, float b) {
  const float y = __frcp_rn(b), aa = fabsf(a), ab = fabsf(b);
  if (ab >= 0x1p-24f && ab <= 0x1p24f && aa >= 0x1p-54f && aa <= 0x1p100f) {
    const float q = __fmul_rn(a, y);
    return fmaf(fmaf(-q, b, a), y, q);
  }
  return a / b;
}
HL_INL float hl_fdiv_fast(float a, float b) {
  const float y = __frcp_rn(b), q = __fmul_rn(a, y);
  return fmaf(fmaf(-q, b, a), y, q);
}
HL_INL bool hl_div_ok(float a, float b) {
  const float aa = fabsf(a), ab = fabsf(b);
  return (ab >= 0x1p-24f) & (ab <= 0x1p24f) & (aa >= 0x1p-54f) & (aa <= 0x1p100f);
}
"""


def _stmt_map(s: Stmt, old: str, new: str, sub: dict[str, Expr]) -> Stmt:
    """`s` with stores to `old` going to `new` and the variables of `sub` replaced in every expression."""
    if isinstance(s, Store):
        return Store(new if s.buffer == old else s.buffer, tuple(substitute(i, sub) for i in s.indices),
                     substitute(s.value, sub))
    if isinstance(s, For):
        return dataclasses.replace(s, min=substitute(s.min, sub), extent=substitute(s.extent, sub),
                                   body=_stmt_map(s.body, old, new, sub))
    if isinstance(s, Seq):
        return Seq(tuple(_stmt_map(x, old, new, sub) for x in s.body))
    if isinstance(s, If):
        return If(substitute(s.cond, sub), _stmt_map(s.then, old, new, sub),
                  None if s.otherwise is None else _stmt_map(s.otherwise, old, new, sub))
    if isinstance(s, Allocate):
        return dataclasses.replace(s, body=_stmt_map(s.body, old, new, sub))
    return s


def _accesses_of(s: Stmt, buf: str, loops: tuple[For, ...] = ()):
    """(indices, loops around the access inside `s`) for every load and store of `buf` in `s`."""
    if isinstance(s, Store):
        if s.buffer == buf:
            yield s.indices, loops
        for e in (*s.indices, s.value):
            for x in walk(e):
                if isinstance(x, Load) and x.buffer == buf:
                    yield x.indices, loops
        return
    if isinstance(s, If):
        for x in walk(s.cond):
            if isinstance(x, Load) and x.buffer == buf:
                yield x.indices, loops
    for c in _children(s):
        yield from _accesses_of(c, buf, (*loops, s) if isinstance(s, For) else loops)


def _lane_private(a: Allocate, p: _KernelPlan) -> tuple[int, frozenset[str]] | None:
    """(s, threadIdx.x loop vars) when local buffer `a` (allocated outside a threadIdx.x loop of a block of one
    row per threadIdx.y: L = block[0] lanes, 32, or 64 / 128 with `LANE_REGISTERS_WIDE`) is lane-private: every
    access is inside exactly one threadIdx.x loop (L lanes) of constant loops, at flat index s * lane + f with
    f % (L s) < s (evaluated at every point), one s for all accesses; None otherwise (the buffer goes to shared
    memory)."""
    n = max(1, math.prod(a.shape))
    lanes = p.block[0]
    if (not LANE_REGISTERS or lanes % 32 or not (lanes == 32 or LANE_REGISTERS_WIDE and lanes <= 128)
            or p.block[2] != 1 or a.dtype not in (DType.F32, DType.S32)):
        return None
    strides, tvars = set(), set()
    try:
        for idx, loops in _accesses_of(a.body, a.buffer):
            tx = [f for f in loops if f.kind is ForKind.THREAD_X]
            if len(tx) != 1 or _const_extent(tx[0]) != lanes or any(
                    f.kind in _BLOCK or (f.kind in _THREAD and f.kind is not ForKind.THREAD_X) for f in loops):
                return None
            ext = [_const_extent(f) for f in loops]
            if math.prod(ext) > 1 << 16:
                return None
            grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in ext], indexing="ij")
            env = {f.var.name: g for f, g in zip(loops, grids)}
            ti = loops.index(tx[0])
            t = env[tx[0].var.name]
            flat = np.zeros(tuple(ext), dtype=np.int64)
            for i, m in zip(idx, a.shape):
                flat = flat * int(m) + _np_ival(i, env)
            f0 = np.take(flat, [0], axis=ti)
            st = int(np.take(flat, [1], axis=ti).ravel()[0] - f0.ravel()[0])
            if st < 1 or not np.array_equal(flat, f0 + st * t) or np.any(f0 % (lanes * st) >= st) or np.any(f0 < 0):
                return None
            strides.add(st)
            tvars.add(tx[0].var.name)
    except (_NoMatch, KeyError, CompileError):
        return None
    if len(strides) != 1 or n % (lanes * min(strides)) or n // lanes > LANE_REGISTERS_MAX:
        return None
    return strides.pop(), frozenset(tvars)


def _written_under_new_thread_axis(s: Stmt, buf: str, bound: frozenset[int], p: _KernelPlan) -> bool:
    if isinstance(s, Store):
        return False
    if isinstance(s, For) and s.kind in _THREAD and _THREAD[s.kind] not in bound and p.block[_THREAD[s.kind]] > 1:
        return any(isinstance(x, Store) and x.buffer == buf for x in walk_stmts(s.body))
    return any(_written_under_new_thread_axis(c, buf, bound, p) for c in _children(s))


# ----------------------------------------------------------------------------- barriers

def _uniform_cond(e: Expr, p: _KernelPlan) -> bool:
    return not (_vars(e) & p.thread_vars) and not any(isinstance(n, Load) for n in walk(e))


def _full_thread_loop(s: For, p: _KernelPlan) -> bool:
    return s.kind in _THREAD and _const_extent(s) == p.block[_THREAD[s.kind]]


def _insert_sync(s: Stmt, p: _KernelPlan, w: frozenset, r: frozenset,
                 force: bool = False) -> tuple[Stmt, frozenset, frozenset]:
    """Insert Barriers into `s` (at a uniform point, with shared buffers `w` written and `r` read since the
    last barrier); returns the new statement and the sets after it.  `force`: treat every statement as
    uniform (to find out whether a non-uniform one would need a barrier inside)."""
    sh = set(p.shared)
    uniform_if = isinstance(s, If) and _uniform_cond(s.cond, p)
    compound = (isinstance(s, Seq | Allocate | If | For) if force else (isinstance(s, Seq | Allocate) or uniform_if
                         or (isinstance(s, For) and (s.kind not in _THREAD or _full_thread_loop(s, p)))))
    rr, ww = _accesses(s)
    rr, ww = frozenset(rr & sh), frozenset(ww & sh)
    if not rr and not ww:
        return s, w, r
    if ((rr & w) or (ww & r)) and not isinstance(s, Seq | Allocate):  # a barrier before the whole loop / if
        s2, w2, r2 = (_insert_sync(s, p, frozenset(), frozenset(), force) if compound else (s, ww, rr))
        return Seq((Barrier(), s2)), w2, r2
    if not compound and not isinstance(s, Store | Barrier):
        inner, _, _ = _insert_sync(s, p, frozenset(), frozenset(), force=True)
        if any(isinstance(x, Barrier) for x in walk_stmts(inner)):
            raise CompileError("a barrier is needed under thread-dependent control flow (a guarded or shorter "
                               "thread loop, or a guard on a thread index)")
    if not compound:
        return s, w | ww, r | rr
    if isinstance(s, Seq):
        out = []
        for c in s.body:
            c2, w, r = _insert_sync(c, p, w, r, force)
            out.append(c2)
        return Seq(tuple(_flatten(out))), w, r
    if isinstance(s, Allocate):
        b, w, r = _insert_sync(s.body, p, w, r, force)
        return Allocate(s.buffer, s.dtype, s.shape, s.scope, b), w, r
    if isinstance(s, If):
        t, w1, r1 = _insert_sync(s.then, p, w, r, force)
        o, w2, r2 = (s.otherwise, w, r) if s.otherwise is None else _insert_sync(s.otherwise, p, w, r, force)
        return If(s.cond, t, o), w1 | w2, r1 | r2
    assert isinstance(s, For)
    if s.kind in _THREAD or s.kind in _BLOCK:
        b, w, r = _insert_sync(s.body, p, w, r, force)
    else:  # sequential: the state after one iteration flows into the next
        _, w1, r1 = _insert_sync(s.body, p, w, r, force)
        b, w, r = _insert_sync(s.body, p, w | w1, r | r1, force)
    return For(s.var, s.min, s.extent, s.kind, b, s.annotations), w, r


def _flatten(stmts: list[Stmt]) -> list[Stmt]:
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            out += _flatten(list(s.body))
        else:
            out.append(s)
    return out


def _check_barriers(s: Stmt, p: _KernelPlan, name: str, uniform: bool = True) -> None:
    if isinstance(s, Barrier) and not uniform:
        raise CompileError(f"kernel {name}: a barrier is needed under thread-dependent control flow "
                           f"(a guarded or shorter thread loop, or a guard on a thread index)")
    if isinstance(s, If):
        uniform = uniform and _uniform_cond(s.cond, p)
    if isinstance(s, For) and s.kind in _THREAD and not _full_thread_loop(s, p):
        uniform = False
    for c in _children(s):
        _check_barriers(c, p, name, uniform)


# ----------------------------------------------------------------------------- emission

class _Emitter:
    def __init__(self, name: str, bufs: dict[str, BufferDecl], plan: _KernelPlan, idx: str, cidx: str):
        self.name = name
        self.bufs = bufs           # name -> decl (params, temps, local/shared allocations)
        self.plan = plan
        self.idx = idx      # the C name of the index type (hl_idx)
        self.cidx = cidx    # what it is: int or long long
        self.lines: list[str] = []
        self.unroll_max = 0
        self.locals: set[str] = set()
        self.if_depth = 0         # > 0 under an If (no block-wide barrier may be emitted there)
        self.n_xred = 0           # cross-thread reductions emitted (unique names)
        self.gemms: dict[str, _Gemm | _IGemm] = {}   # loop var -> GEMM template (`_gemm_loops`)
        self.raster: str | None = None   # the blockIdx.x loop's value (`_kernel_raster`; None: blockIdx.x)
        self.n_vec = 0            # vectorized stores emitted (unique names)
        self.div_group: list[tuple[str, str]] | None = None   # a float4 store's quotients (ROW_DIV_GROUPED)
        self.plain_div = False    # the division itself (a grouped store's fallback)

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    # ---- statements
    def stmt(self, s: Stmt, d: int, bb: frozenset[int], bt: frozenset[int]) -> None:
        if isinstance(s, Seq):
            for x in s.body:
                self.stmt(x, d, bb, bt)
        elif isinstance(s, Store):
            self.store(s, d, bb, bt)
        elif isinstance(s, For):
            self.for_(s, d, bb, bt)
        elif isinstance(s, Allocate):
            self.allocate(s, d, bb, bt)
        elif isinstance(s, If):
            self.if_depth += 1
            self.line(d, f"if ({self.expr(s.cond)}) {{")
            self.stmt(s.then, d + 1, bb, bt)
            if s.otherwise is not None:
                self.line(d, "} else {")
                self.stmt(s.otherwise, d + 1, bb, bt)
            self.line(d, "}")
            self.if_depth -= 1
        elif isinstance(s, Barrier):
            if self.plan.warp_private:
                self.line(d, "__syncwarp();")
            elif self.plan.row_barrier:   # the row's warps only: named barrier threadIdx.y of block[0] threads
                self.line(d, f'asm volatile("bar.sync %0, {self.plan.block[0]};" :: "r"((int)threadIdx.y) : "memory");')
            else:
                self.line(d, "__syncthreads();")
        else:
            raise CompileError(f"cannot generate CUDA code for statement {type(s).__name__}")

    def for_(self, s: For, d: int, bb: frozenset[int], bt: frozenset[int]) -> None:
        v = sanitize(s.var.name)
        if s.kind in _BLOCK or s.kind in _THREAD:
            is_b = s.kind in _BLOCK
            ax = _BLOCK[s.kind] if is_b else _THREAD[s.kind]
            n = _const_extent(s)
            hw = ("blockIdx." if is_b else "threadIdx.") + _AXIS[ax]
            full = (self.plan.grid if is_b else self.plan.block)[ax]
            if is_b and ax == 0 and self.plan.stride_x:   # grid-stride loop over the block tiles
                self.line(d, f"for ({self.idx} {v} = ({self.idx}){hw}; {v} < {n}; {v} += ({self.idx})gridDim.x) {{")
                self.stmt(s.body, d + 1, bb | {ax}, bt)
                self.line(d, "}")
                return
            if is_b and ax == 0 and self.raster:
                hw = self.raster
            self.line(d, "{")
            self.line(d + 1, f"const {self.idx} {v} = ({self.idx}){hw};")
            if n < full:
                self.line(d + 1, f"if ({v} < {n}) {{")
            nb, nt = (bb | {ax}, bt) if is_b else (bb, bt | {ax})
            self.stmt(s.body, d + 2 if n < full else d + 1, nb, nt)
            if n < full:
                self.line(d + 1, "}")
            self.line(d, "}")
            return
        if s.kind is ForKind.VECTORIZED and self.vector_store(s, d, bb, bt):
            return
        g = self.gemms.get(s.var.name)
        if isinstance(g, _IGemm):
            for ln in igemm_text(g, sanitize(g.acc), self.expr,
                                 lambda ld: self.offset(self._decl(ld.buffer), ld.indices),
                                 lambda b: self._decl(b).shape):
                self.line(d, ln)
            return
        if g is not None:
            acc, a, b = (sanitize(x) for x in (g.acc, g.a, g.b))
            for ln in gemm_text(g, acc, a, b):
                self.line(d, ln)
            return
        red = self._cross_thread_pattern(s, bt)
        if red is not None:
            return self.cross_thread_reduce(s, red, d, bb, bt)
        pf = self._row_prefetch(s)
        if pf is not None:
            return self.row_prefetch(s, *pf, d, bb, bt)
        ann = dict(s.annotations)
        saved = self.unroll_max
        if "auto_unroll_max_step" in ann:
            self.unroll_max = int(ann["auto_unroll_max_step"])  # type: ignore[arg-type]
        n = s.const_extent
        if s.kind in (ForKind.UNROLLED, ForKind.VECTORIZED, ForKind.VTHREAD) or (
                n is not None and 0 < self.unroll_max and unroll_size(s) <= self.unroll_max):
            self.line(d, "#pragma unroll")
        lo = self.expr(s.min)
        hi = self.expr(s.extent)
        end = hi if lo == "0" else f"({lo}) + ({hi})"
        self.line(d, f"for ({self.idx} {v} = {lo}; {v} < {end}; ++{v}) {{")
        self.stmt(s.body, d + 1, bb, bt)
        self.line(d, "}")
        self.unroll_max = saved

    # ---- rows in sequence with the next row's loads in flight (the row-register schedule's K rows per warp)
    def _row_prefetch(self, s: For) -> tuple[list[tuple[Allocate, Stmt]], Stmt] | None:
        """([(allocation, fill)...], rest) when `s` is an unrolled loop of constant extent >= 2 whose body starts
        with lane-register buffers (`_lane_private`), each allocated and filled from kernel inputs alone (the
        fill writes nothing else, reads nothing allocated in the kernel) before any other statement."""
        if not ROW_PREFETCH or s.kind is not ForKind.UNROLLED or (s.const_extent or 0) < 2 or not (
                isinstance(s.min, Const) and s.min.value == 0):
            return None
        chain, body = [], s.body
        while isinstance(body, Allocate) and body.buffer in self.plan.lane_regs:
            inner = body.body.body if isinstance(body.body, Seq) else (body.body,)
            fill = inner[0]
            if len(inner) < 2 or not self._is_fill(fill, body.buffer):
                break
            chain.append((body, fill))
            body = inner[1] if len(inner) == 2 else Seq(inner[1:])
        return (chain, body) if chain else None

    def _is_fill(self, fill: Stmt, buf: str) -> bool:
        stmts = list(walk_stmts(fill))
        if any(isinstance(x, Barrier | Allocate) for x in stmts):
            return False
        stores = [x for x in stmts if isinstance(x, Store)]
        if not stores or any(x.buffer != buf for x in stores):
            return False
        for x in stores:
            for e in (*x.indices, x.value):
                for ld in walk(e):
                    if isinstance(ld, Load) and (ld.buffer not in self.bufs or self.bufs[ld.buffer].scope != "global"):
                        return False
        return True

    def row_prefetch(self, s: For, chain: list[tuple[Allocate, Stmt]], rest: Stmt, d: int, bb: frozenset[int],
                     bt: frozenset[int]) -> None:
        """Row 0's fill into the prefetch registers, then per row: the row's registers taken from them, the next
        row's fill issued (its loads in flight during this row's reductions and stores), this row's work."""
        v, k = sanitize(s.var.name), s.const_extent
        nxt = Binary(Op.ADD, s.var, Const(1, INDEX), INDEX)
        saved = dict(self.bufs)
        self.line(d, "{  // rows in sequence: the next row's loads before this row's work")
        for a, _ in chain:
            pf = a.buffer + ".pf"
            self.plan.lane_regs[pf] = self.plan.lane_regs[a.buffer]
            self.bufs[pf] = BufferDecl(pf, a.shape, a.dtype, "local")
            self.line(d + 1, f"{ctype(a.dtype)} {sanitize(pf)}[{max(1, math.prod(a.shape)) // self.plan.lanes}];")
        for a, fill in chain:
            self.stmt(_stmt_map(fill, a.buffer, a.buffer + ".pf", {s.var.name: Const(0, INDEX)}), d + 1, bb, bt)
        self.line(d + 1, "#pragma unroll" if ROW_PREFETCH_UNROLL else "#pragma unroll 1")
        self.line(d + 1, f"for ({self.idx} {v} = 0; {v} < {k}; ++{v}) {{")
        for a, _ in chain:
            n = max(1, math.prod(a.shape)) // self.plan.lanes
            self.bufs[a.buffer] = BufferDecl(a.buffer, a.shape, a.dtype, "local")
            self.line(d + 2, f"{ctype(a.dtype)} {sanitize(a.buffer)}[{n}];")
            self.line(d + 2, "#pragma unroll")
            self.line(d + 2, f"for (int hl_i = 0; hl_i < {n}; ++hl_i) {sanitize(a.buffer)}[hl_i] = "
                             f"{sanitize(a.buffer + '.pf')}[hl_i];")
        self.line(d + 2, f"if ({v} + 1 < {k}) {{")
        for a, fill in chain:
            self.stmt(_stmt_map(fill, a.buffer, a.buffer + ".pf", {s.var.name: nxt}), d + 3, bb, bt)
        self.line(d + 2, "}")
        self.stmt(rest, d + 2, bb, bt)
        self.line(d + 1, "}")
        self.line(d, "}")
        self.bufs = saved

    # ---- cross-thread reduction: a serial combine loop that thread 0 alone would run
    def _cross_thread_pattern(self, s: For, bt: frozenset[int]) -> tuple[Op, Expr, Store] | None:
        """(op, E, store) when `s` is `for v in [0, n): B[I] = B[I] op E(v)` at a uniform point of a 1-D block
        of whole warps, with B not thread-local and E reading no thread-local buffer; in a block of one warp per
        threadIdx.y row, B may be thread-local (every lane computes the same value: a warp all-reduce); in a block of
        two or more warps per threadIdx.y row (64 / 128 lanes), only a thread-local B (each warp reduces all of E
        in the same order: the row's warps get the same total)."""
        p = self.plan
        rows = bt == frozenset({1}) and p.block[0] % 32 == 0 and p.block[2] == 1   # whole warps per threadIdx.y
        warp = rows and p.block[0] == 32     # one warp per threadIdx.y
        if not rows and (bt or p.block[1] != 1 or p.block[2] != 1 or p.block[0] < 32 or p.block[0] % 32):
            return None
        if self.if_depth:
            return None
        n = s.const_extent
        body = s.body.body[0] if isinstance(s.body, Seq) and len(s.body.body) == 1 else s.body
        if n is None or n < 2 or not (isinstance(s.min, Const) and s.min.value == 0) or not isinstance(body, Store):
            return None
        decl = self.bufs.get(body.buffer)
        v = body.value
        if decl is None or (decl.scope == "local" and not rows) or decl.dtype not in _XRED_TYPES:
            return None
        if rows and not warp and decl.scope != "local":
            return None
        if not isinstance(v, Binary) or not WARP_ALLREDUCE and decl.scope == "local":
            return None
        if v.op not in _XRED_OPS or v.dtype is not decl.dtype:
            return None
        me = Load(body.buffer, body.indices, decl.dtype)
        other = v.b if v.a == me else v.a if v.b == me else None
        if other is None or any(s.var.name in _vars(i) for i in body.indices):
            return None
        for x in walk(other):
            if isinstance(x, Load):
                xd = self.bufs.get(x.buffer)
                if x.buffer == body.buffer or xd is None or xd.scope == "local":
                    return None
        return v.op, other, body

    def cross_thread_reduce(self, s: For, red: tuple[Op, Expr, Store], d: int, bb: frozenset[int],
                            bt: frozenset[int]) -> None:
        """Each thread combines a strided share of the iterations, then warp shuffles and one shared slot per
        warp; thread 0 applies the total to B[I] (the same result up to the order of the combines)."""
        op, e, st = red
        dt = self._decl(st.buffer).dtype
        rt = _reg(dt)
        k = self.n_xred
        self.n_xred += 1
        acc, has, x = f"hl_acc{k}", f"hl_has{k}", f"hl_x{k}"
        comb = self.expr(Binary(op, Var(acc, dt), Var(x, dt), dt))
        v = sanitize(s.var.name)
        nw = self.plan.block[0] // 32

        if self._decl(st.buffer).scope == "local":   # thread-local total: butterfly, every lane gets it
            self.line(d, "{  // warp all-reduce")
            lane = "threadIdx.x" if self.plan.block[0] == 32 else "(threadIdx.x & 31)"   # every warp: all of E
            self.line(d + 1, f"{rt} {acc} = ({rt})0; bool {has} = false;")
            self.line(d + 1, f"for ({self.idx} {v} = ({self.idx}){lane}; {v} < {s.const_extent}; {v} += 32) {{")
            self.line(d + 2, f"{rt} {x} = {self.expr(e)};")
            self.line(d + 2, f"{acc} = {has} ? {comb} : {x}; {has} = true;")
            self.line(d + 1, "}")
            self.line(d + 1, "#pragma unroll")
            self.line(d + 1, "for (int hl_o = 16; hl_o > 0; hl_o >>= 1) {")
            self.line(d + 2, f"{rt} {x} = __shfl_xor_sync(0xffffffffu, {acc}, hl_o);")
            self.line(d + 2, f"bool hl_h = __shfl_xor_sync(0xffffffffu, (int){has}, hl_o) != 0;")
            self.line(d + 2, f"if (hl_h) {{ {acc} = {has} ? {comb} : {x}; {has} = true; }}")
            self.line(d + 1, "}")
            fin = Store(st.buffer, st.indices, Binary(op, Load(st.buffer, st.indices, dt), Var(acc, dt), dt))
            self.store(fin, d + 1, bb, bt)
            self.line(d, "}")
            return

        def warp_reduce(dd: int) -> None:
            self.line(dd, "#pragma unroll")
            self.line(dd, "for (int hl_o = 16; hl_o > 0; hl_o >>= 1) {")
            self.line(dd + 1, f"{rt} {x} = __shfl_down_sync(0xffffffffu, {acc}, hl_o);")
            self.line(dd + 1, f"bool hl_h = __shfl_down_sync(0xffffffffu, (int){has}, hl_o) != 0;")
            self.line(dd + 1, f"if (hl_h && (threadIdx.x & 31) + hl_o < 32) {{ {acc} = {has} ? {comb} : {x}; "
                              f"{has} = true; }}")
            self.line(dd, "}")

        self.line(d, "{  // cross-thread reduction")
        self.line(d + 1, f"{rt} {acc} = ({rt})0; bool {has} = false;")
        self.line(d + 1, f"for ({self.idx} {v} = ({self.idx})threadIdx.x; {v} < {s.const_extent}; "
                         f"{v} += {self.plan.block[0]}) {{")
        self.line(d + 2, f"{rt} {x} = {self.expr(e)};")
        self.line(d + 2, f"{acc} = {has} ? {comb} : {x}; {has} = true;")
        self.line(d + 1, "}")
        warp_reduce(d + 1)
        if bt:   # one warp per threadIdx.y: lane 0 has the total
            fin = Store(st.buffer, st.indices, Binary(op, Load(st.buffer, st.indices, dt), Var(acc, dt), dt))
            self.store(fin, d + 1, bb, bt)
            self.line(d, "}")
            return
        self.line(d + 1, f"__shared__ {rt} hl_rv{k}[32]; __shared__ int hl_rh{k}[32];")
        self.line(d + 1, f"if ((threadIdx.x & 31) == 0) {{ hl_rv{k}[threadIdx.x >> 5] = {acc}; "
                         f"hl_rh{k}[threadIdx.x >> 5] = (int){has}; }}")
        self.line(d + 1, "__syncthreads();")
        self.line(d + 1, "if (threadIdx.x < 32) {")
        self.line(d + 2, f"{has} = threadIdx.x < {nw} && hl_rh{k}[threadIdx.x] != 0;")
        self.line(d + 2, f"{acc} = {has} ? hl_rv{k}[threadIdx.x] : ({rt})0;")
        warp_reduce(d + 2)
        fin = Store(st.buffer, st.indices, Binary(op, Load(st.buffer, st.indices, dt), Var(acc, dt), dt))
        self.store(fin, d + 2, bb, bt)
        self.line(d + 1, "}")
        self.line(d + 1, "__syncthreads();")
        self.line(d, "}")

    def allocate(self, s: Allocate, d: int, bb: frozenset[int], bt: frozenset[int]) -> None:
        decl = BufferDecl(s.buffer, s.shape, s.dtype, "shared" if s.buffer in self.plan.shared else "local")
        old = self.bufs.get(s.buffer)
        self.bufs[s.buffer] = decl
        if decl.scope == "local":
            n = max(1, math.prod(s.shape)) // (self.plan.lanes if s.buffer in self.plan.lane_regs else 1)
            self.line(d, "{")
            self.line(d + 1, f"{ctype(s.dtype)} {sanitize(s.buffer)}[{n}];")
            self.stmt(s.body, d + 1, bb, bt)
            self.line(d, "}")
        else:
            self.stmt(s.body, d, bb, bt)
        if old is None:
            self.bufs.pop(s.buffer, None)
        else:
            self.bufs[s.buffer] = old

    def store(self, s: Store, d: int, bb: frozenset[int], bt: frozenset[int]) -> None:
        decl = self._decl(s.buffer)
        val = self.expr(s.value)
        if decl.dtype is DType.F16:
            val = f"__float2half_rn({val})"
        text = f"{sanitize(s.buffer)}[{self.offset(decl, s.indices)}] = {val};"
        if decl.scope != "local":  # one writer per element: thread/block 0 of every unbound launched axis
            conds = [f"threadIdx.{_AXIS[a]} == 0" for a in range(3) if a not in bt and self.plan.block[a] > 1]
            conds += [f"blockIdx.{_AXIS[a]} == 0" for a in range(3) if a not in bb and self.plan.grid[a] > 1]
            if conds:
                text = f"if ({' && '.join(conds)}) {text}"
        self.line(d, text)

    # ---- float4 / float2 stores of a VECTORIZED loop
    def vector_store(self, s: For, d: int, bb: frozenset[int], bt: frozenset[int]) -> bool:
        """`for v in [0, V): [if (c)] B[I(v)] = E(v)` with V in (2, 4), B float32 written at consecutive, V-aligned
        elements (`_lane_form`) and c true for all lanes or none: one float4/float2 store; every float32 load at
        consecutive aligned elements one vector load, the other loads per lane.  False (emit nothing) otherwise."""
        nv = s.const_extent
        if nv not in (2, 4) or not (isinstance(s.min, Const) and s.min.value == 0):
            return False
        body = s.body.body[0] if isinstance(s.body, Seq) and len(s.body.body) == 1 else s.body
        cond = None
        if isinstance(body, If) and body.otherwise is None:
            cond = _lane_invariant_cond(body.cond, s.var.name, nv)
            if cond is None:
                return False
            body = body.then.body[0] if isinstance(body.then, Seq) and len(body.then.body) == 1 else body.then
        if not isinstance(body, Store):
            return False
        decl = self.bufs.get(body.buffer)
        regs = decl is not None and decl.scope == "local" and body.buffer in self.plan.lane_regs
        if decl is None or (decl.scope == "local" and not regs) or decl.dtype is not DType.F32:
            return False
        v = s.var.name
        base = _vector_access(body.indices, decl.shape, v, nv)
        if not regs and (base is None or base[1] != 1):
            return False
        loads: dict[tuple, tuple[str, tuple[Expr, ...]]] = {}

        def vec_load(e: Expr) -> Expr:
            if isinstance(e, Load):
                ld = self.bufs.get(e.buffer)
                if ld is not None and ld.scope != "local" and ld.dtype is DType.F32:
                    acc = _vector_access(e.indices, ld.shape, v, nv)
                    if acc is not None and acc[1] == 1:
                        key = (e.buffer, e.indices)
                        if key not in loads:
                            loads[key] = (f"hl_vl{self.n_vec}_{len(loads)}", acc[0])
                        return Var(f"{loads[key][0]}_{{lane}}", DType.F32)
            return e

        val = rebuild(body.value, vec_load)
        vt = "float4" if nv == 4 else "float2"
        k = self.n_vec
        self.n_vec += 1
        comps = "xyzw"
        guard = self._guard(decl, bb, bt)
        conds = [c for c in (self.expr(cond) if cond is not None else None, guard) if c]
        self.line(d, f"{{  // vectorized x{nv}")
        dd = d + 1
        if conds:
            self.line(dd, f"if ({' && '.join(conds)}) {{")
            dd += 1
        for (buf, _), (name, idx) in loads.items():
            off = self.offset(self._decl(buf), idx)
            if STREAM_HINTS and _streamed(self._decl(buf), decl):
                self.line(dd, f"const {vt} {name} = __ldcs((const {vt}*)&{sanitize(buf)}[{off}]);")
            else:
                self.line(dd, f"const {vt} {name} = *(const {vt}*)&{sanitize(buf)}[{off}];")
            self.line(dd, "const float " + ", ".join(f"{name}_{j} = {name}.{comps[j]}" for j in range(nv)) + ";")
        if not regs:
            self.line(dd, f"{vt} hl_vs{k};")
        divs: list[tuple[str, str]] = []
        for j in range(nv):
            lane = substitute(rebuild(val, lambda n, j=j: Var(n.name.replace("{lane}", str(j)), n.dtype)
                                      if isinstance(n, Var) and n.name.endswith("_{lane}") else n),
                              {v: Const(j, INDEX)})
            if regs:   # a lane-private register row: the vector loads, then one register per lane
                at = tuple(substitute(i, {v: Const(j, INDEX)}) for i in body.indices)
                self.line(dd, f"{sanitize(body.buffer)}[{self.offset(decl, at)}] = {self.expr(lane)};")
            else:
                self.div_group = [] if (ROW_DIV_RCP or ROW_DIV_EXPR) and ROW_DIV_GROUPED else None
                self.line(dd, f"hl_vs{k}.{comps[j]} = {self.expr(lane)};")
                divs += self.div_group or []
                self.div_group = None
        if divs:   # grouped quotients: one guard for the four, else all four by the division
            self.line(dd, "if (!(" + " & ".join(f"hl_div_ok({a}, {b})" for a, b in divs) + ")) {")
            self.plain_div = True
            for j in range(nv):
                lane = substitute(rebuild(val, lambda n, j=j: Var(n.name.replace("{lane}", str(j)), n.dtype)
                                          if isinstance(n, Var) and n.name.endswith("_{lane}") else n),
                                  {v: Const(j, INDEX)})
                self.line(dd + 1, f"hl_vs{k}.{comps[j]} = {self.expr(lane)};")
            self.plain_div = False
            self.line(dd, "}")
        if not regs and STREAM_HINTS and decl.scope == "global":   # an output: written once
            self.line(dd, f"__stcs(({vt}*)&{sanitize(body.buffer)}[{self.offset(decl, base[0])}], hl_vs{k});")
        elif not regs:
            self.line(dd, f"*({vt}*)&{sanitize(body.buffer)}[{self.offset(decl, base[0])}] = hl_vs{k};")
        if conds:
            self.line(dd - 1, "}")
        self.line(d, "}")
        return True

    def _guard(self, decl: BufferDecl, bb: frozenset[int], bt: frozenset[int]) -> str:
        """The one-writer condition of a store to a shared or global buffer (see `store`), or ""."""
        if decl.scope == "local":
            return ""
        conds = [f"threadIdx.{_AXIS[a]} == 0" for a in range(3) if a not in bt and self.plan.block[a] > 1]
        conds += [f"blockIdx.{_AXIS[a]} == 0" for a in range(3) if a not in bb and self.plan.grid[a] > 1]
        return " && ".join(conds)

    def _decl(self, name: str) -> BufferDecl:
        try:
            return self.bufs[name]
        except KeyError:
            raise CompileError(f"buffer {name!r} is used but not declared (params or Allocate)") from None

    def offset(self, decl: BufferDecl, indices: tuple[Expr, ...]) -> str:
        if len(indices) != len(decl.shape):
            raise CompileError(f"buffer {decl.name!r} has rank {len(decl.shape)} but is indexed with "
                               f"{len(indices)} indices")
        lane = self.plan.lane_regs.get(decl.name) if decl.scope == "local" else None
        if lane is not None:   # the lane's own elements s * lane + f: register (f / (L s)) * s + f % s, L lanes
            st, tvars = lane
            f = self.offset(dataclasses.replace(decl, name=""),
                            tuple(substitute(i, {v: Const(0, INDEX) for v in tvars}) for i in indices))
            nl = self.plan.lanes
            return f"({f}) / {nl}" if st == 1 else f"(({f}) / {nl * st}) * {st} + ({f}) % {st}"
        terms = []
        stride = 1
        for idx, n in zip(reversed(indices), reversed(decl.shape)):
            if not (isinstance(idx, Const) and idx.value == 0):
                t = self.expr(idx)
                terms.append(t if stride == 1 else f"({t}) * {stride}")
            stride *= max(int(n), 1)
        if decl.scope == "shared":   # a promoted buffer with one copy per thread of the axes bound where allocated
            for a in self.plan.replicas.get(decl.name, ()):
                terms.append(f"({self.idx})threadIdx.{_AXIS[a]} * {stride}")
                stride *= self.plan.block[a]
        return " + ".join(reversed(terms)) if terms else "0"

    # ---- expressions (C text of the register type of e.dtype)
    def expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return sanitize(e.name)
        if isinstance(e, Const):
            return const_text(e, self.cidx)
        if isinstance(e, Load):
            decl = self._decl(e.buffer)
            t = f"{sanitize(e.buffer)}[{self.offset(decl, e.indices)}]"
            return f"__half2float({t})" if decl.dtype is DType.F16 else t
        if isinstance(e, Unary):
            return self.unary(e)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Compare):
            return f"({self.expr(e.a)} {_CMP[e.direction]} {self.expr(e.b)})"
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.t)} : {self.expr(e.f)})"
        if isinstance(e, Cast):
            return self.convert(self.expr(e.a), e.a.dtype, e.dtype)
        raise CompileError(f"cannot generate CUDA code for expression {type(e).__name__}")

    def unary(self, e: Unary) -> str:
        x, dt, src, op = self.expr(e.a), e.dtype, e.a.dtype, e.op
        if op is Op.IS_FINITE:
            return f"isfinite({x})"
        if op is Op.NOT:
            return f"(!{x})" if src is DType.PRED else f"(({_reg(dt)})~{x})"
        if src.is_float:
            rt = "double" if src is DType.F64 else "float"
            if op is Op.NEGATE:
                v = f"(-{x})"
            elif op is Op.ABS:
                v = f"fabs(({rt}){x})"
            elif op in (Op.FLOOR, Op.CEIL, Op.ROUND_NEAREST_EVEN):
                v = f"{ {Op.FLOOR: 'floor', Op.CEIL: 'ceil', Op.ROUND_NEAREST_EVEN: 'rint'}[op]}(({rt}){x})"
            elif op is Op.SIGN:
                v = f"hl_fsign<{rt}>({x})"
            elif op in _MATH:
                v = f"{_MATH[op]}(({rt}){x})"
            else:
                raise CompileError(f"unary op {op.value} is not supported on floats by the CUDA code generator")
            return _round(dt, v)
        t = _reg(dt)
        if op is Op.NEGATE:
            return f"(({t})(0u - ({_UNSIGNED[src]}){x}))" if src in _UNSIGNED else f"(({t})(0 - {x}))"
        if op is Op.ABS:
            return f"(({t})({x} < 0 ? -{x} : {x}))" if src in _UNSIGNED else x
        if op in (Op.FLOOR, Op.CEIL, Op.ROUND_NEAREST_EVEN):
            return x
        if op is Op.SIGN:
            return f"(({t})(({x} > 0) - ({x} < 0)))"
        raise CompileError(f"unary op {op.value} is not supported on {src.value} by the CUDA code generator")

    def binary(self, e: Binary) -> str:
        a, b, dt, op = self.expr(e.a), self.expr(e.b), e.a.dtype, e.op
        if dt is INDEX and e.dtype is INDEX and _is_index_expr(e):
            return self._index_binary(e, a, b)
        if dt.is_float:
            rt = "double" if dt is DType.F64 else "float"
            sym = {Op.ADD: "+", Op.SUBTRACT: "-", Op.MULTIPLY: "*", Op.DIVIDE: "/"}.get(op)
            if (op is Op.DIVIDE and dt is DType.F32 and e.dtype is DType.F32 and self._row_scalar(e.b)
                    and not self._row_expr(e.a)):   # a row-invariant quotient is computed once per row anyway
                if self.div_group is not None:   # a grouped float4 store: its guard checks every quotient
                    self.div_group.append((a, b))
                    v = f"hl_fdiv_fast({a}, {b})"
                else:
                    v = f"hl_fdiv_row({a}, {b})"
            elif sym is not None:
                v = f"({a} {sym} {b})"
            elif op is Op.REMAINDER:
                v = f"fmod(({rt}){a}, ({rt}){b})"
            elif op is Op.MAXIMUM:
                v = f"hl_fmax<{rt}>({a}, {b})"
            elif op is Op.MINIMUM:
                v = f"hl_fmin<{rt}>({a}, {b})"
            elif op in (Op.ATAN2, Op.POWER):
                v = f"{_MATH[op]}(({rt}){a}, ({rt}){b})"
            else:
                raise CompileError(f"binary op {op.value} is not supported on floats by the CUDA code generator")
            return _round(e.dtype, v)
        if dt is DType.PRED:
            if op in (Op.AND, Op.MULTIPLY, Op.MINIMUM):
                return f"({a} && {b})"
            if op in (Op.OR, Op.ADD, Op.MAXIMUM):
                return f"({a} || {b})"
            if op in (Op.XOR, Op.SUBTRACT):
                return f"({a} != {b})"
            raise CompileError(f"binary op {op.value} is not supported on pred by the CUDA code generator")
        return self._int_binary(op, a, b, dt)

    def _row_scalar(self, e: Expr) -> bool:
        """`e` is a row's scalar in a row-register kernel, the divisor `hl_fdiv_row` takes: a size-1 local buffer (a
        reduction's result: softmax's sum) with ROW_DIV_RCP on, or a float expression of such buffers and constants
        (layernorm's sqrt(var / n + eps), at least one such buffer: not a constant) with ROW_DIV_EXPR on."""
        if self.plain_div or not self.plan.lane_regs:
            return False
        if isinstance(e, Load):
            return ROW_DIV_RCP and self._row_local(e)
        return (ROW_DIV_EXPR and self._row_expr(e)
                and any(isinstance(n, Load) and n.buffer not in self.plan.lane_regs for n in walk(e)))

    def _row_expr(self, e: Expr) -> bool:
        """`e` is a float expression of constants and row scalars (`_row_local`) only."""
        if isinstance(e, Load):
            return self._row_local(e)
        if isinstance(e, Const):
            return True
        return isinstance(e, Unary | Binary | Cast) and e.dtype.is_float and all(map(self._row_expr, children(e)))

    def _row_local(self, e: Load) -> bool:
        """`e` reads a size-1 local buffer that is not a lane-register row (a row's scalar)."""
        decl = self.bufs.get(e.buffer)
        return (e.buffer not in self.plan.lane_regs and decl is not None and decl.scope == "local"
                and math.prod(decl.shape) == 1 and all(isinstance(i, Const) for i in e.indices))

    def _index_binary(self, e: Binary, a: str, b: str) -> str:
        op = e.op
        sym = {Op.ADD: "+", Op.SUBTRACT: "-", Op.MULTIPLY: "*"}.get(op)
        if sym is not None:
            return f"({a} {sym} {b})"
        if op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) and int(e.b.value) > 0:
            return f"({a} {'/' if op is Op.DIVIDE else '%'} {b})"
        if op is Op.MAXIMUM:
            return f"hl_imax<{self.idx}>({a}, {b})"
        if op is Op.MINIMUM:
            return f"hl_imin<{self.idx}>({a}, {b})"
        return self._int_binary(op, a, b, DType.S64)

    def _int_binary(self, op: Op, a: str, b: str, dt: DType) -> str:
        t = _reg(dt)
        signed = dt in _UNSIGNED
        ut = _UNSIGNED.get(dt, t)
        if op in (Op.ADD, Op.SUBTRACT, Op.MULTIPLY):
            sym = {Op.ADD: "+", Op.SUBTRACT: "-", Op.MULTIPLY: "*"}[op]
            if dt in (DType.S8, DType.U8):
                return f"(({t})({a} {sym} {b}))"
            return f"(({t})(({ut}){a} {sym} ({ut}){b}))"
        if op is Op.DIVIDE:
            if signed:
                return f"hl_sdiv<{t}>({a}, {b}, ({t}){_INT_RANGE[dt][0]}{'LL' if dt is DType.S64 else ''})"
            return f"hl_udiv<{t}>({a}, {b})"
        if op is Op.REMAINDER:
            return f"hl_srem<{t}>({a}, {b})" if signed else f"hl_urem<{t}>({a}, {b})"
        if op is Op.MAXIMUM:
            return f"hl_imax<{t}>({a}, {b})"
        if op is Op.MINIMUM:
            return f"hl_imin<{t}>({a}, {b})"
        if op in (Op.AND, Op.OR, Op.XOR):
            return f"(({t})({a} {({Op.AND: '&', Op.OR: '|', Op.XOR: '^'})[op]} {b}))"
        if op is Op.POWER:
            return f"hl_ipow<{t}, {ut}>({a}, {b}, {'true' if signed else 'false'})"
        raise CompileError(f"binary op {op.value} is not supported on {dt.value} by the CUDA code generator")

    def convert(self, x: str, src: DType, dst: DType) -> str:
        if src is dst:
            return x
        t = _reg(dst)
        if dst is DType.PRED:
            return f"({x} != 0)"
        if src is DType.PRED:
            return _round(dst, f"(({t})({x} ? 1 : 0))")
        if src.is_float and dst.is_float:
            if src is DType.F64 and dst in (DType.BF16, DType.F16):
                x = f"((float){x})"
            return _round(dst, f"(({t}){x})")
        if src.is_float:
            lo, hi = _INT_RANGE[dst]
            sfx = "LL" if dst is DType.S64 else ("u" if dst is DType.U32 else "")
            lo_t = f"({t})({lo}{sfx})" if lo != -(2 ** 63) else "(long long)(-9223372036854775807LL - 1)"
            return f"hl_f2i<{t}>((double){x}, {float(lo)!r}, {float(hi)!r}, {lo_t}, ({t}){hi}{sfx})"
        if dst.is_float:
            return _round(dst, f"(({t}){x})")
        return f"(({t}){x})"


_XRED_OPS = frozenset({Op.ADD, Op.MULTIPLY, Op.MAXIMUM, Op.MINIMUM})
#: barriers of warp-private kernels (`_KernelPlan.warp_private`) as __syncwarp
WARP_BARRIERS = True
#: barriers of blocks of two or more warps per row whose shared buffers are per row (`_KernelPlan.row_barrier`) as a
#: named barrier per row (bar.sync threadIdx.y) instead of __syncthreads
ROW_BARRIERS = True
#: thread-local combines of per-lane partials (the row-fused schedule's reductions) as warp all-reduces
WARP_ALLREDUCE = True
_XRED_TYPES = frozenset({DType.F32, DType.F64, DType.S32})


# ----------------------------------------------------------------------------- scalar replacement

def _rewrite_expr(e: Expr, buf: str, idx: tuple[Expr, ...], reg: str) -> Expr:
    """`e` with every Load(buf, idx) replaced by Load(reg, (0,))."""
    if isinstance(e, Load):
        if e.buffer == buf:
            return Load(reg, (Const(0, INDEX),), e.dtype)
        return Load(e.buffer, tuple(_rewrite_expr(i, buf, idx, reg) for i in e.indices), e.dtype)
    if isinstance(e, Var | Const):
        return e
    changes = {}
    for f in dataclasses.fields(e):
        val = getattr(e, f.name)
        if isinstance(val, Expr):
            changes[f.name] = _rewrite_expr(val, buf, idx, reg)
    return dataclasses.replace(e, **changes)


def _rewrite_stmt(s: Stmt, buf: str, idx: tuple[Expr, ...], reg: str) -> Stmt:
    def rx(e: Expr) -> Expr:
        return _rewrite_expr(e, buf, idx, reg)
    if isinstance(s, Store):
        val = rx(s.value)
        if s.buffer == buf:
            return Store(reg, (Const(0, INDEX),), val)
        return Store(s.buffer, tuple(rx(i) for i in s.indices), val)
    if isinstance(s, Seq):
        return Seq(tuple(_rewrite_stmt(c, buf, idx, reg) for c in s.body))
    if isinstance(s, For):
        return For(s.var, rx(s.min), rx(s.extent), s.kind, _rewrite_stmt(s.body, buf, idx, reg), s.annotations)
    if isinstance(s, If):
        o = None if s.otherwise is None else _rewrite_stmt(s.otherwise, buf, idx, reg)
        return If(rx(s.cond), _rewrite_stmt(s.then, buf, idx, reg), o)
    if isinstance(s, Allocate):
        return Allocate(s.buffer, s.dtype, s.shape, s.scope, _rewrite_stmt(s.body, buf, idx, reg))
    return s


def _all_exprs(s: Stmt):
    for x in walk_stmts(s):
        if isinstance(x, Store):
            yield from x.indices
            yield x.value
        elif isinstance(x, If):
            yield x.cond
        elif isinstance(x, For):
            yield x.min
            yield x.extent


def _scalarize_body(body: Stmt, allocated: dict) -> Stmt:
    """Inside one thread's loop body, a kernel buffer accessed at one loop-invariant element only (the
    `rf[t, 0] += ...` of an rfactor partial) lives in a register: loaded once, stored back once.  This
    keeps shared memory (and the barriers it would need) out of the accumulation loop."""
    inner = [x for x in walk_stmts(body) if isinstance(x, For)]
    if (any(f.kind in _THREAD or f.kind in _BLOCK for f in inner)
            or any(isinstance(x, Barrier) for x in walk_stmts(body))):
        return body
    inner_vars = {f.var.name for f in inner}
    inside = {a.buffer for a in walk_stmts(body) if isinstance(a, Allocate)}   # already per thread
    allocated = {k: v for k, v in allocated.items() if k not in inside}
    access: dict[str, set] = {}
    count: dict[str, int] = {}
    stored: set[str] = set()
    for x in walk_stmts(body):
        if isinstance(x, Store) and x.buffer in allocated:
            access.setdefault(x.buffer, set()).add(x.indices)
            count[x.buffer] = count.get(x.buffer, 0) + 1
            stored.add(x.buffer)
    for e in _all_exprs(body):
        for n in walk(e):
            if isinstance(n, Load) and n.buffer in allocated:
                access.setdefault(n.buffer, set()).add(n.indices)
                count[n.buffer] = count.get(n.buffer, 0) + 1
    for buf, idxs in access.items():
        if len(idxs) != 1 or buf not in stored or count[buf] < 3:
            continue
        (idx,) = idxs
        if any(_vars(i) & inner_vars for i in idx) or any(isinstance(n, Load) for i in idx for n in walk(i)):
            continue
        a = allocated[buf]
        reg = f"{buf}.reg"
        first = body.body[0] if isinstance(body, Seq) and body.body else body
        new = _rewrite_stmt(body, buf, idx, reg)
        pre: tuple[Stmt, ...] = ()
        if not (isinstance(first, Store) and first.buffer == buf
                and not any(isinstance(n, Load) and n.buffer == buf for n in walk(first.value))):
            pre = (Store(reg, (Const(0, INDEX),), Load(buf, idx, a.dtype)),)
        post = Store(buf, idx, Load(reg, (Const(0, INDEX),), a.dtype))
        body = Allocate(reg, a.dtype, (1,), "local", Seq((*pre, new, post)))
    return body


def _scalarize(s: Stmt, allocated: dict) -> Stmt:
    """Scalar replacement (see `_scalarize_body`) in every thread loop; `allocated`: name -> Allocate or
    BufferDecl of the kernel's own buffers and the function's global temporaries."""
    if isinstance(s, For):
        b = _scalarize(s.body, allocated)
        if s.kind in _THREAD:
            b = _scalarize_body(b, allocated)
        return For(s.var, s.min, s.extent, s.kind, b, s.annotations)
    if isinstance(s, Seq):
        return Seq(tuple(_scalarize(c, allocated) for c in s.body))
    if isinstance(s, If):
        return If(s.cond, _scalarize(s.then, allocated),
                  None if s.otherwise is None else _scalarize(s.otherwise, allocated))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, s.dtype, s.shape, s.scope, _scalarize(s.body, allocated))
    return s


def _is_index_expr(e: Expr) -> bool:
    return not any(isinstance(n, Load) or (n.dtype is not INDEX and not isinstance(n, Compare)) for n in walk(e))


def _round(dt: DType, v: str) -> str:
    if dt is DType.BF16:
        return f"hl_bf16({v})"
    if dt is DType.F16:
        return f"hl_f16({v})"
    return v


def const_text(c: Const, idx: str = "long long") -> str:
    """A C literal of `c` in its register type (exact)."""
    dt = c.dtype
    if dt is DType.PRED:
        return "true" if c.value else "false"
    if dt.is_float:
        v = float(c.value)
        if dt is DType.BF16:
            import struct
            b = struct.unpack("<I", struct.pack("<f", v))[0] if math.isfinite(v) else None
            if b is not None:
                b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
                v = struct.unpack("<f", struct.pack("<I", b))[0]
        elif dt is DType.F16:
            import numpy as np
            with np.errstate(over="ignore"):
                v = float(np.float16(v))
        f64 = dt is DType.F64
        if math.isnan(v):
            return "__longlong_as_double(0x7ff8000000000000LL)" if f64 else "__int_as_float(0x7fc00000)"
        if math.isinf(v):
            if f64:
                return f"__longlong_as_double({'0xfff0000000000000ULL' if v < 0 else '0x7ff0000000000000LL'})"
            return f"__int_as_float({'(int)0xff800000u' if v < 0 else '0x7f800000'})"
        if not f64:
            import numpy as np
            with np.errstate(over="ignore"):
                v = float(np.float32(v))
            if math.isinf(v):
                return f"__int_as_float({'(int)0xff800000u' if v < 0 else '0x7f800000'})"
            return f"{v.hex()}f" if v != 0 else ("-0.0f" if math.copysign(1, v) < 0 else "0.0f")
        return v.hex() if v != 0 else ("-0.0" if math.copysign(1, v) < 0 else "0.0")
    v = int(c.value)
    if dt is INDEX:
        return str(v) if idx == "int" and abs(v) < 2 ** 31 else f"{v}LL"
    if dt is DType.U32:
        return f"{v & 0xFFFFFFFF}u"
    if dt is DType.S64:
        return f"{v}LL" if v != -(2 ** 63) else "(-9223372036854775807LL - 1)"
    if dt is DType.S32 and v == -(2 ** 31):
        return "(-2147483647 - 1)"
    return f"(({_reg(dt)}){v})"


# ----------------------------------------------------------------------------- vectorized accesses

def _mult(e: Expr) -> int:
    """A number that provably divides the (non-negative) index expression `e` (0: e is 0)."""
    if isinstance(e, Const):
        return abs(int(e.value))
    if isinstance(e, Binary):
        if e.op in (Op.ADD, Op.SUBTRACT):
            return math.gcd(_mult(e.a), _mult(e.b))
        if e.op is Op.MULTIPLY:
            return _mult(e.a) * _mult(e.b)
        if e.op is Op.REMAINDER and isinstance(e.b, Const):
            return math.gcd(_mult(e.a), abs(int(e.b.value)))
    return 1


def _lane_form(e: Expr, v: str, nv: int) -> tuple[Expr, int] | None:
    """(base, c) with e == base + c * v for every lane v in [0, nv) (base free of v), or None.  Division and
    remainder by a constant multiple of nv keep the form when the dividend is base + v with base a multiple of
    nv (the lanes then share the quotient)."""
    if isinstance(e, Var):
        return (Const(0, INDEX), 1) if e.name == v else (e, 0)
    if isinstance(e, Const):
        return (e, 0) if e.dtype is INDEX else None
    if not isinstance(e, Binary) or e.dtype is not INDEX:
        return None
    a, b = _lane_form(e.a, v, nv), _lane_form(e.b, v, nv)
    if a is None or b is None:
        return None
    op = e.op
    if op in (Op.ADD, Op.SUBTRACT):
        return Binary(op, a[0], b[0], INDEX), a[1] + b[1] if op is Op.ADD else a[1] - b[1]
    if op is Op.MULTIPLY:
        if a[1] == 0 and b[1] == 0:
            return Binary(op, a[0], b[0], INDEX), 0
        if b[1] == 0 and isinstance(e.b, Const):
            return Binary(op, a[0], e.b, INDEX), a[1] * int(e.b.value)
        if a[1] == 0 and isinstance(e.a, Const):
            return Binary(op, e.a, b[0], INDEX), b[1] * int(e.a.value)
        return None
    if op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) and int(e.b.value) > 0 and b[1] == 0:
        if a[1] == 0:
            return Binary(op, a[0], e.b, INDEX), 0
        c = int(e.b.value)
        if a[1] == 1 and c % nv == 0 and _mult(a[0]) % nv == 0:
            return Binary(op, a[0], e.b, INDEX), (0 if op is Op.DIVIDE else 1)
    if op in (Op.MINIMUM, Op.MAXIMUM) and a[1] == 0 and b[1] == 0:   # a clamp of lane-invariant values
        return Binary(op, a[0], b[0], INDEX), 0
    return None


def _vector_access(indices: tuple[Expr, ...], shape: tuple[int, ...], v: str,
                   nv: int) -> tuple[tuple[Expr, ...], int] | None:
    """(indices at lane 0, element stride between lanes) of a row-major access whose lane-0 element is a
    multiple of nv (so a vector of nv elements is aligned), or None."""
    forms = [_lane_form(i, v, nv) for i in indices]
    if any(f is None for f in forms):
        return None
    stride, coeff, mult = 1, 0, 0
    for (b, c), n in zip(reversed(forms), reversed(tuple(shape))):
        coeff += c * stride
        mult = math.gcd(mult, _mult(b) * stride)
        stride *= max(int(n), 1)
    if coeff not in (0, 1) or (coeff == 1 and mult % nv):
        return None
    return tuple(b for b, _ in forms), coeff


def _lane_invariant_cond(c: Expr, v: str, nv: int) -> Expr | None:
    """`c` as a condition without the lane var when it has the same value for every lane (`i < N` with i = base
    + v, base and N multiples of nv: `base < N`), else None."""
    if v not in _vars(c):
        return c
    if isinstance(c, Compare) and c.direction == "LT" and isinstance(c.b, Const) and int(c.b.value) % nv == 0:
        f = _lane_form(c.a, v, nv)
        if f is not None and f[1] == 1 and _mult(f[0]) % nv == 0:
            return Compare("LT", f[0], c.b, c.dtype)
    if isinstance(c, Binary) and c.op is Op.AND:
        a, b = _lane_invariant_cond(c.a, v, nv), _lane_invariant_cond(c.b, v, nv)
        if a is not None and b is not None:
            return Binary(Op.AND, a, b, c.dtype)
    return None


# ----------------------------------------------------------------------------- GEMM template

#: the GEMM template replaces the generic code of a matching K-tile loop (benchmarks switch it off to compare)
GEMM_TEMPLATE = True
GEMM_SPLIT_B = True    # 8 columns per thread: B's shared rows in two halves (conflict-free float4 reads)
#: the GEMM template's global -> shared copy: 0 = float4 loads into registers during the K tile, stored to the
#: other of two shared buffers after it (the prefetch registers count against the register tile); S >= 2 = a
#: ring of S shared stages filled by `cp.async` (sm_80+; a plain copy below), S - 1 tiles in flight, no
#: prefetch registers (fewer stages where S would not fit in 48 KB)
GEMM_STAGES = 3
#: with cp.async: A kept row-major in shared memory (its 16-byte copies verbatim; each thread reads a float4 of
#: 4 k values per row and uses it against 4 rows of B) instead of transposed by 4-byte copies
GEMM_A_ROW = True
#: where the cp.async ring is used (measured on the H200 against the register prefetch, logs/gpu_s4b): register
#: tiles of at most GEMM_ASYNC_MAX_MR rows (16x4 at 4096^3: 42.3k against 43.2k GFLOP/s), and for MR = 8 only in
#: grids of at least GEMM_ASYNC_MR8_BLOCKS blocks (rmsnorm_swiglu / transformer_block dots of 256-704 blocks 3-4 %
#: faster, matmul 1024^3 in 128 blocks 2 % slower); MR <= 4 always (mlp2 24.7 -> 15.9 us, dense_bias_relu 52.1 ->
#: 42.5 us)
GEMM_ASYNC_MAX_MR = 8
GEMM_ASYNC_MR8_BLOCKS = 256
#: session 10 (issue #7): FFMA tilings of 8x16 / 16x8 per thread on 256 threads (`cuda_simt.simt_fits`) run the
#: `cuda_simt` template: the K loop in quads on plain shared tiles (B by cp.async, A^T through registers, a ring of
#: GEMM_SIMT_STAGES), the tile moved between the quads and the loop nest's layout through shared memory before and
#: after it (dynamic shared memory, at most GEMM_SIMT_SHARED_LIMIT), one block per SM, the blocks in groups of
#: GEMM_SIMT_GROUP tile rows (`simt_raster`; 0: row-major).  H200 (docs/gpu.md "Session 10: FFMA GEMM"): 128x256x16 at
#: 4096^3, the prototype of this design 97.5 % of cuBLAS float32 against 85.7 % for 8x4/8x32/BK16
GEMM_SIMT = True
GEMM_SIMT_STAGES = 2
GEMM_SIMT_SHARED_LIMIT = 140 * 1024
GEMM_SIMT_GROUP = 8


@dataclass(frozen=True)
class _Gemm:
    """What the GEMM template needs of one K-tile loop (see `_gemm_info`)."""

    a: str
    b: str
    acc: str
    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    mr: int
    nr: int
    threads: int
    a_batch: int    # elements between consecutive batches of A (0: A has no batch dimensions)
    b_batch: int
    stages: int = 0     # 0: register prefetch, two shared buffers; >= 2: a cp.async ring (`GEMM_STAGES`)
    a_row: bool = False     # cp.async: A row-major in shared memory (`GEMM_A_ROW`)
    mma: int = 0        # tensor cores (`_gemm_mma_text`): TF32 passes per product, 3 (3xTF32) or 1; 0: FFMA
    pad_a: int = 4      # mma: floats of padding per row of A's shared tile (`_mma_pad_a`)
    smem_off: int = -1  # mma: byte offset of its tiles in the kernel's dynamic shared memory (-1: static arrays)
    wgmma: bool = False     # mma = 3 on Hopper's warpgroup MMA (`cuda_wgmma`, sm_90a; `GEMM_WGMMA`)
    simt: bool = False      # FFMA, the big-tile template of `cuda_simt` (`GEMM_SIMT`)
    raster: bool = False    # simt: the kernel runs its blocks in `simt_raster`'s order (set by `_kernel`)
    lda: int = 0            # elements per row of A (0: k); a split-K partial dot reads a K slice of longer rows

    @property
    def ka(self) -> int:
        """A's row stride in elements."""
        return self.lda or self.k

    @property
    def shared_bytes(self) -> int:
        if self.wgmma:
            return wgmma_shared_bytes(self, self.stages)
        if self.simt:
            return simt_shared_bytes(self, self.stages)
        if self.mma:    # the ring, and with `GEMM_MMA_B_PLANES` B's small TF32 plane (3xTF32)
            plane = self.bk * self.bn if GEMM_MMA_B_PLANES and self.mma == 3 else 0
            return 4 * (self.stages * (self.bm * (self.bk + self.pad_a) + self.bk * self.bn) + plane)
        return 4 * max(2, self.stages) * self.bk * (self.bm + 4 + self.bn)


class _NoMatch(Exception):
    pass


_IOPS = {Op.ADD: lambda a, b: a + b, Op.SUBTRACT: lambda a, b: a - b, Op.MULTIPLY: lambda a, b: a * b,
         Op.DIVIDE: lambda a, b: a // b, Op.REMAINDER: lambda a, b: a % b, Op.MAXIMUM: max, Op.MINIMUM: min}


def _ival(e: Expr, env: dict[str, int]) -> int:
    """Value of an index expression (non-negative operands) under `env`; _NoMatch for anything else."""
    if isinstance(e, Var):
        if e.name not in env:
            raise _NoMatch(e.name)
        return env[e.name]
    if isinstance(e, Const) and e.dtype is INDEX:
        return int(e.value)
    if isinstance(e, Binary) and e.op in _IOPS:
        return _IOPS[e.op](_ival(e.a, env), _ival(e.b, env))
    raise _NoMatch(type(e).__name__)


def _store_paths(s: Stmt, loops: tuple[For, ...] = ()):
    """(store, loops around it inside `s`) for every Store; _NoMatch under an If or a non-constant loop."""
    if isinstance(s, Store):
        yield s, loops
    elif isinstance(s, For):
        if s.const_extent is None or not (isinstance(s.min, Const) and s.min.value == 0):
            raise _NoMatch("loop bounds")
        yield from _store_paths(s.body, (*loops, s))
    elif isinstance(s, Seq | Allocate):
        for c in _children(s):
            yield from _store_paths(c, loops)
    elif not isinstance(s, Barrier):
        raise _NoMatch(type(s).__name__)


def _flat(idx: list[int], shape: tuple[int, ...]) -> int:
    f = 0
    for i, n in zip(idx, shape):
        f = f * n + i
    return f


def _points(loops: tuple[For, ...], base: dict[str, int]):
    """Every iteration of `loops` (a loop bound to threadIdx.x: every thread) as an environment over `base`."""
    names = [f.var.name for f in loops]
    for vals in itertools.product(*[range(int(f.const_extent)) for f in loops]):
        env = dict(base)
        env.update(zip(names, vals))
        yield env


def _gemm_info(s: For, bufs: dict, plan: _KernelPlan, hw: dict[str, str]) -> _Gemm | None:
    """The GEMM template's parameters when the serial loop `s` is, in a 1-D grid of 1-D blocks of T threads, a
    K-tile loop of the tiled-dot structure: a cooperative fetch of a (BM, BK) tile of A (row-major (batch.., M,
    K) float32) and a (BK, BN) tile of B ((batch.., K, N)) into shared memory, then acc[MR, NR] += A.shared *
    B.shared, each thread owning rows (tid / TJ) * MR + [0, MR) and columns (tid % TJ) * NR + [0, NR) of the
    block's tile (block = (batch, tile row, tile column), row-major).  The index expressions are checked by
    evaluating them over every fetch and compute iteration (for the first and last block and K tile), so any
    other mapping keeps the generic code.  `hw`: loop var -> "bid" / "tid" (blockIdx.x / threadIdx.x loops)."""
    if not GEMM_TEMPLATE or s.kind is not ForKind.SERIAL or s.const_extent is None:
        return None
    if not (isinstance(s.min, Const) and s.min.value == 0) or plan.block[1:] != [1, 1] or plan.grid[1:] != [1, 1]:
        return None
    try:
        return _gemm_check(s, bufs, plan, hw)
    except _NoMatch:
        return None


def _gemm_check(s: For, bufs: dict, plan: _KernelPlan, hw: dict[str, str]) -> _Gemm | None:
    paths = list(_store_paths(s.body))
    shared = {a.buffer: a for a in walk_stmts(s.body) if isinstance(a, Allocate) and a.scope == "shared"}
    comp = [(x, lp) for x, lp in paths if x.buffer not in shared]
    if len(comp) != 1 or len(paths) != 3 or len(shared) != 2:
        return None
    st, cloops = comp[0]
    v = st.value
    if not (isinstance(v, Binary) and v.op is Op.ADD and isinstance(v.a, Load) and v.a.buffer == st.buffer
            and v.a.indices == st.indices and isinstance(v.b, Binary) and v.b.op is Op.MULTIPLY
            and isinstance(v.b.a, Load) and isinstance(v.b.b, Load)):
        return None
    la_, lb_ = v.b.a, v.b.b
    acc = bufs.get(st.buffer)
    sa, sb = shared.get(la_.buffer), shared.get(lb_.buffer)
    if acc is None or acc.scope != "local" or acc.dtype is not DType.F32 or sa is None or sb is None or sa is sb:
        return None
    fetch = {x.buffer: (x, lp) for x, lp in paths if x.buffer in shared}
    fa, fb = fetch[sa.buffer], fetch[sb.buffer]
    if not (isinstance(fa[0].value, Load) and isinstance(fb[0].value, Load)):
        return None
    ga, gb = bufs.get(fa[0].value.buffer), bufs.get(fb[0].value.buffer)
    if ga is None or gb is None or ga.scope != "global" or gb.scope != "global" or ga.dtype is not DType.F32 \
            or gb.dtype is not DType.F32 or len(ga.shape) < 2 or len(gb.shape) < 2:
        return None
    if any(x != 1 for x in (*sa.shape[:-2], *sb.shape[:-2], *acc.shape[:-2])) or len(acc.shape) < 2:
        return None
    (m, k), (k2, n) = ga.shape[-2:], gb.shape[-2:]
    (bm, bk), (bk2, bn) = sa.shape[-2:], sb.shape[-2:]
    mr, nr = acc.shape[-2:]
    t = plan.block[0]
    kt = int(s.const_extent)
    if k != k2 or bk != bk2 or bm % mr or bn % nr or (bm // mr) * (bn // nr) != t or m % bm or n % bn:
        return None
    lda, kk = k, kt * bk     # split K (an rfactor's partial dots, batch = K slice): a batch reads kk of A's k columns
    split = kk != k and len(ga.shape) == 2 and len(gb.shape) == 2 and k % kk == 0
    if not split and kt != k // bk or k % bk or bk % 4 or bn % 4 or n % 4 or k % 4:
        return None
    if any(x % t and t % x for x in (bm * bk // 4, bk * bn // 4)):   # float4s per tile: a multiple or a divisor of T
        return None
    tiles = (m // bm) * (n // bn)
    nbat = plan.grid[0] // tiles
    if nbat * tiles != plan.grid[0] or any(math.prod(g.shape[:-2]) not in (1, nbat) for g in (ga, gb)):
        return None
    if split and nbat != k // kk:
        return None
    if split:
        g = _Gemm(ga.name, gb.name, st.buffer, m, n, kk, bm, bn, bk, mr, nr, t, kk, kk * n, lda=lda)
    else:
        g = _Gemm(ga.name, gb.name, st.buffer, m, n, k, bm, bn, bk, mr, nr, t,
                  m * k if len(ga.shape) > 2 and nbat > 1 else 0, k * n if len(gb.shape) > 2 and nbat > 1 else 0)
    koff = kk if split else 0     # the K offset of batch bb: bb * koff
    tc = dict(s.annotations).get("tensor_core", 0)
    wg_limit = min(GEMM_WGMMA_SHARED_LIMIT, _shared_cap())
    wg = GEMM_WGMMA and tc == 3 and GEMM_MMA and _ARCH.get() in WGMMA_ARCHS and wgmma_fits(g) and \
        wgmma_stages(g, GEMM_WGMMA_STAGES, wg_limit) > 0
    mma = tc in MMA_PASSES and GEMM_MMA and (_mma_fits(g) or wg)
    simt = not mma and _simt_ok(g)
    if g.shared_bytes > STATIC_SHARED_LIMIT and not mma and not simt:
        return None
    if simt:
        g = dataclasses.replace(g, simt=True, stages=simt_stages(g, GEMM_SIMT_STAGES, _simt_limit()))
    elif wg:
        g = dataclasses.replace(g, mma=3, wgmma=True, a_row=True,
                                stages=wgmma_stages(g, GEMM_WGMMA_STAGES, wg_limit))
    elif mma:
        g = _mma_gemm(g, int(tc))
    elif GEMM_STAGES >= 2 and mr <= GEMM_ASYNC_MAX_MR and (mr < 8 or plan.grid[0] >= GEMM_ASYNC_MR8_BLOCKS):
        per_stage = 4 * bk * (bm + 4 + bn)
        stages = min(GEMM_STAGES, STATIC_SHARED_LIMIT // per_stage, kt + 1)
        if stages >= 2:
            g = dataclasses.replace(g, stages=stages, a_row=GEMM_A_ROW)
    bids = [x for x, kd in hw.items() if kd == "bid"]
    tids = [x for x, kd in hw.items() if kd == "tid"]
    tj = bn // nr
    # the compute: every (i, j, kk) exactly once per thread, at the template's rows / columns
    for tid in (0, t - 1, t // 2 + 1):
        seen = set()
        for env in _points(cloops, {**{x: tid for x in tids}, s.var.name: 0}):
            i, j = divmod(_flat([_ival(x, env) for x in st.indices], acc.shape), nr)
            p, q = (_ival(x, env) for x in la_.indices[-2:])
            q2, c = (_ival(x, env) for x in lb_.indices[-2:])
            if (p != (tid // tj) * mr + i or c != (tid % tj) * nr + j or q != q2 or not 0 <= q < bk
                    or any(_ival(x, env) for x in (*la_.indices[:-2], *lb_.indices[:-2]))):
                return None
            seen.add((i, j, q))
        if len(seen) != mr * nr * bk or math.prod(int(f.const_extent) for f in cloops) != len(seen):
            return None
    # the fetches: every element of the tile, from A[bb, bi * BM + p, kt * BK + q] (B likewise)
    for bid, ktv in ((0, 0), (plan.grid[0] - 1, kt - 1)):
        bb, rest = divmod(bid, tiles)
        bi, bj = divmod(rest, n // bn)
        for (fs, lp), gd, rows, cols, r0, c0 in ((fa, ga, bm, bk, bi * bm, bb * koff + ktv * bk),
                                                  (fb, gb, bk, bn, bb * koff + ktv * bk, bj * bn)):
            seen = set()
            base = {**{x: bid for x in bids}, s.var.name: ktv}
            for env in _points(lp, base):
                p, q = (_ival(x, env) for x in fs.indices[-2:])
                src = [_ival(x, env) for x in fs.value.indices]
                if src[-2:] != [r0 + p, c0 + q] or not (0 <= p < rows and 0 <= q < cols):
                    return None
                if len(src) > 2 and _flat(src[:-2], gd.shape[:-2]) != (bb if math.prod(gd.shape[:-2]) > 1 else 0):
                    return None
                seen.add((p, q))
            if len(seen) != rows * cols:
                return None
    return g


def _shared_cap() -> int:
    """The most shared memory one block may take on the arch being generated for (`target.cuda_shared_limit`)."""
    return cuda_shared_limit(_ARCH.get())


def _simt_limit() -> int:
    return min(GEMM_SIMT_SHARED_LIMIT, _shared_cap())


def _simt_ok(g: _Gemm) -> bool:
    """Whether an FFMA tiling runs the `cuda_simt` template (`GEMM_SIMT`; cp.async and its shared memory within the
    arch's limit: sm_80 and later, not sm_86 / sm_89 with their 99 KB)."""
    return (GEMM_SIMT and (cuda_cc(_ARCH.get()) or 0) >= 80 and simt_fits(g)
            and simt_stages(g, GEMM_SIMT_STAGES, _simt_limit()) > 0)


def _simt_block_pointers(g: _Gemm, a: str, b: str) -> list[str]:
    """`_gemm_block_pointers` with the block index the kernel runs as (`simt_raster`; blockIdx.x without it)."""
    ras = simt_raster(g, GEMM_SIMT_GROUP) if g.raster else None
    return _gemm_block_pointers(g, a, b, ras or "blockIdx.x")


def _fragment(name: str, arr: str, n: int, base: str) -> list[str]:
    """CUDA lines loading `n` floats of shared array `arr` from `base` into a register array `name` (float4
    reads when n is a multiple of 4), for the GEMM and implicit-GEMM templates."""
    out = [f"      float {name}[{n}];"]
    if n % 4 == 0:
        for v in range(0, n, 4):
            out.append(f"      {{ const float4 t = *(const float4*)&{arr}[{base} + {v}]; {name}[{v}] = t.x; "
                       f"{name}[{v + 1}] = t.y; {name}[{v + 2}] = t.z; {name}[{v + 3}] = t.w; }}")
    else:
        out += [f"      {name}[{v}] = {arr}[{base} + {v}];" for v in range(n)]
    return out


def _double_buffered_k_loop(kt: int, bk: int, mr: int, nr: int, acc: str, load_next: list[str],
                            store_next: list[str], b_frag: list[str]) -> list[str]:
    """The K-tile loop of the GEMM and implicit-GEMM templates: tile kt + 1 is loaded into registers
    (`load_next`) while tile kt is computed from shared buffer hl_cur (A fragment of `mr`, B fragment `b_frag`
    of `nr`, `acc[i * nr + j] += a[i] * b[j]`), then stored into the other buffer (`store_next`); one barrier per
    tile."""
    return [f"  for (int hl_kt = 0; hl_kt < {kt}; ++hl_kt) {{",
            "    const int hl_cur = hl_kt & 1;",
            f"    if (hl_kt + 1 < {kt}) {{", *["  " + x for x in load_next], "    }",
            "    #pragma unroll",
            f"    for (int hl_kk = 0; hl_kk < {bk}; ++hl_kk) {{",
            *_fragment("hl_a", "hl_As[hl_cur][hl_kk]", mr, "hl_r0"),
            *b_frag,
            "      #pragma unroll",
            f"      for (int i = 0; i < {mr}; ++i) {{",
            "        #pragma unroll",
            f"        for (int j = 0; j < {nr}; ++j) {acc}[i * {nr} + j] = {acc}[i * {nr} + j] + "
            "hl_a[i] * hl_b[j];",
            "      }",
            "    }",
            f"    if (hl_kt + 1 < {kt}) {{", *["  " + x for x in store_next], "    }",
            "    __syncthreads();",
            "  }"]


def _gemm_block_pointers(g: _Gemm, a: str, b: str, bid: str = "blockIdx.x") -> list[str]:
    """The GEMM templates' first lines after the shared declarations: thread and block index (`bid`: the block index
    expression), the block's tile (column, row, batch: column tiles vary fastest) and its A and B pointers."""
    nbj, nbi = g.n // g.bn, g.m // g.bm
    return [f"  const int hl_tid = threadIdx.x, hl_bid = {bid};",
            f"  const int hl_bj = hl_bid % {nbj}, hl_bi = (hl_bid / {nbj}) % {nbi}, hl_bb = hl_bid / {nbj * nbi};",
            f"  const float* __restrict__ hl_A = {a} + (long long)hl_bb * {g.a_batch}LL + (long long)hl_bi * "
            f"{g.bm * g.ka}LL;",
            f"  const float* __restrict__ hl_B = {b} + (long long)hl_bb * {g.b_batch}LL + hl_bj * {g.bn};"]


def gemm_text(g: _Gemm, acc: str, a: str, b: str) -> list[str]:
    """CUDA C lines of the GEMM template: double-buffered shared tiles (one barrier per K tile, the next tile
    loaded into registers while the current one is computed), float4 global loads, A stored transposed in
    shared memory so that both operands are read as float4; acc[i * NR + j] += A[row, k] * B[k, col] for the
    thread's rows (tile row * BM + (tid / TJ) * MR + i) and columns (tile col * BN + (tid % TJ) * NR + j).
    With `g.stages` >= 2 the cp.async ring instead (`_gemm_async_text`), with `g.mma` tensor cores
    (`_gemm_mma_text`)."""
    if g.mma:
        return _gemm_mma_text(g, acc, a, b)
    if g.simt:
        return simt_text(g, acc, a, b, _simt_block_pointers(g, a, b))
    if g.stages >= 2:
        return _gemm_async_text(g, acc, a, b)
    tj = g.bn // g.nr
    na, nb = g.bm * g.bk // 4, g.bk * g.bn // 4        # float4s per tile
    la, lb = max(1, na // g.threads), max(1, nb // g.threads)
    ga = f"if (hl_tid < {na}) " if na < g.threads else ""
    gb = f"if (hl_tid < {nb}) " if nb < g.threads else ""
    ap = g.bm + 4      # padded row of the transposed A tile
    kt = g.k // g.bk
    o = [f"{{  // GEMM template: {g.bm}x{g.bn}x{g.bk} tile, {g.mr}x{g.nr} per thread, double-buffered",
         f"  __shared__ __align__(16) float hl_As[2][{g.bk}][{ap}];",
         f"  __shared__ __align__(16) float hl_Bs[2][{g.bk}][{g.bn}];",
         *_gemm_block_pointers(g, a, b),
         f"  const int hl_r0 = (hl_tid / {tj}) * {g.mr}, hl_c0 = (hl_tid % {tj}) * {g.nr};",
         f"  float4 hl_ra[{la}], hl_rb[{lb}];"]
    # A float4 number q = tid + l*T: row q / (BK/4), k offset (q % (BK/4)) * 4; B: row q / (BN/4), col (q % (BN/4))*4
    ka, nb4 = g.bk // 4, g.bn // 4
    # 8 columns per thread: B's shared row holds each thread's first 4 columns in its first half and the other 4
    # in its second half (column c of the tile at (c % 8 // 4) * BN/2 + c // 8 * 4), so a warp's float4 reads of
    # B are consecutive (no bank conflicts); the register tile keeps the output's column order
    split = g.nr == 8 and GEMM_SPLIT_B

    def load(kexpr: str) -> list[str]:
        out = []
        for q in range(la):
            out.append(f"    {ga}{{ const int q = hl_tid + {q * g.threads}; hl_ra[{q}] = __ldg((const float4*)(hl_A + "
                       f"(q / {ka}) * {g.ka} + {kexpr} * {g.bk} + (q % {ka}) * 4)); }}")
        for q in range(lb):
            out.append(f"    {gb}{{ const int q = hl_tid + {q * g.threads}; hl_rb[{q}] = __ldg((const float4*)(hl_B + "
                       f"({kexpr} * {g.bk} + q / {nb4}) * {g.n} + (q % {nb4}) * 4)); }}")
        return out

    def store(buf: str) -> list[str]:
        out = []
        for q in range(la):
            out.append(f"    {ga}{{ const int q = hl_tid + {q * g.threads}, r = q / {ka}, c = (q % {ka}) * 4;")
            out.append(f"      hl_As[{buf}][c][r] = hl_ra[{q}].x; hl_As[{buf}][c + 1][r] = hl_ra[{q}].y; "
                       f"hl_As[{buf}][c + 2][r] = hl_ra[{q}].z; hl_As[{buf}][c + 3][r] = hl_ra[{q}].w; }}")
        for q in range(lb):
            col = f"((q % {nb4}) & 1) * {g.bn // 2} + ((q % {nb4}) >> 1) * 4" if split else f"(q % {nb4}) * 4"
            out.append(f"    {gb}{{ const int q = hl_tid + {q * g.threads}; "
                       f"*(float4*)&hl_Bs[{buf}][q / {nb4}][{col}] = hl_rb[{q}]; }}")
        return out

    frag = _fragment

    def split_frag() -> list[str]:
        out = ["      float hl_b[8];"]
        for v, base in ((0, "hl_c0 / 2"), (4, f"{g.bn // 2} + hl_c0 / 2")):
            out.append(f"      {{ const float4 t = *(const float4*)&hl_Bs[hl_cur][hl_kk][{base}]; hl_b[{v}] = t.x; "
                       f"hl_b[{v + 1}] = t.y; hl_b[{v + 2}] = t.z; hl_b[{v + 3}] = t.w; }}")
        return out

    o += ["  {", *load("0"), *store("0"), "  }", "  __syncthreads();",
          *_double_buffered_k_loop(kt, g.bk, g.mr, g.nr, acc, load("(hl_kt + 1)"), store("hl_cur ^ 1"),
                                   split_frag() if split else frag("hl_b", "hl_Bs[hl_cur][hl_kk]", g.nr, "hl_c0")),
          "}"]
    return o


#: sm_80+ asynchronous copies (a plain copy on older GPUs, where the commit / wait are no-ops); added to a
#: module's prelude only when a kernel uses them
CP_ASYNC_PRELUDE = r"""
__device__ __forceinline__ void hl_cp16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src) : "memory");
#else
  *(float4*)dst = __ldg((const float4*)src);
#endif
}
__device__ __forceinline__ void hl_cp4(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)),
               "l"(src) : "memory");
#else
  *(float*)dst = __ldg((const float*)src);
#endif
}
__device__ __forceinline__ void hl_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void hl_cp_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}
"""


def _cp_async_ring(st: int, kt: int, issue, body: list[str]) -> list[str]:
    """The K loop of a cp.async ring of `st` stages over `kt` tiles (both GEMM templates that use one): the first
    st - 1 tiles issued up front (one commit group per tile, empty past the last), then per tile: wait for its group,
    one barrier, issue tile kt + st - 1 into the slot freed last, commit, `body` (the compute on slot hl_cur).
    `issue(k, slot)` gives the copy lines of tile k into ring slot `slot` (C expressions)."""
    o: list[str] = []
    for s0 in range(st - 1):
        o += ["  {", *issue(str(s0), str(s0)), "  }"] if s0 < kt else []
        o.append("  hl_cp_commit();")
    return o + ["  int hl_cur = 0;",
                f"  for (int hl_kt = 0; hl_kt < {kt}; ++hl_kt) {{",
                f"    hl_cp_wait<{st - 2}>();",
                "    __syncthreads();",
                f"    if (hl_kt + {st - 1} < {kt}) {{",
                f"      const int hl_nk = hl_kt + {st - 1}, hl_ns = hl_cur == 0 ? {st - 1} : hl_cur - 1;",
                *issue("hl_nk", "hl_ns"),
                "    }",
                "    hl_cp_commit();",
                *body,
                f"    hl_cur = hl_cur == {st - 1} ? 0 : hl_cur + 1;",
                "  }",
                "  __syncthreads();",
                "}"]


def _gemm_async_text(g: _Gemm, acc: str, a: str, b: str) -> list[str]:
    """The GEMM template with a ring of `g.stages` shared stages filled by cp.async: before the loop tiles 0..S-2
    are issued (one commit group each); K tile kt waits until its group is complete (at most S-2 newer ones
    pending), one barrier (every thread's copies visible, and every thread done with tile kt-1, whose stage
    tile kt+S-1 then refills), issues tile kt+S-1, computes tile kt.  B is copied verbatim (16 bytes; split in
    halves for 8 columns per thread as in `gemm_text`); A either transposed by 4-byte copies (the compute of
    `gemm_text`) or, with `g.a_row`, kept row-major: per 4 k values a thread reads 4 float4 rows of B and, per
    row i, one float4 of A (4 k values), in k order per accumulator (the same sums as `gemm_text`)."""
    tj = g.bn // g.nr
    na, nb = g.bm * g.bk // 4, g.bk * g.bn // 4        # float4s per tile
    la, lb = max(1, na // g.threads), max(1, nb // g.threads)
    ga = f"if (hl_tid < {na}) " if na < g.threads else ""
    gb = f"if (hl_tid < {nb}) " if nb < g.threads else ""
    st = g.stages
    kt = g.k // g.bk
    ka, nb4 = g.bk // 4, g.bn // 4
    split = g.nr == 8 and GEMM_SPLIT_B
    a_decl = (f"  __shared__ __align__(16) float hl_As[{st}][{g.bm}][{g.bk}];" if g.a_row
              else f"  __shared__ __align__(16) float hl_As[{st}][{g.bk}][{g.bm + 4}];")
    o = [f"{{  // GEMM template: {g.bm}x{g.bn}x{g.bk} tile, {g.mr}x{g.nr} per thread, {st}-stage cp.async ring"
         f"{', A row-major' if g.a_row else ''}",
         a_decl,
         f"  __shared__ __align__(16) float hl_Bs[{st}][{g.bk}][{g.bn}];",
         *_gemm_block_pointers(g, a, b),
         f"  const int hl_r0 = (hl_tid / {tj}) * {g.mr}, hl_c0 = (hl_tid % {tj}) * {g.nr};"]

    def issue(kexpr: str, sexpr: str) -> list[str]:
        out = []
        for q in range(la):
            src = f"hl_A + r * {g.ka} + {kexpr} * {g.bk} + c"
            if g.a_row:
                cp = f"hl_cp16(&hl_As[{sexpr}][r][c], {src});"
            else:
                cp = " ".join(f"hl_cp4(&hl_As[{sexpr}][c + {v}][r], {src} + {v});" for v in range(4))
            out.append(f"      {ga}{{ const int q = hl_tid + {q * g.threads}, r = q / {ka}, c = (q % {ka}) * 4; "
                       f"{cp} }}")
        for q in range(lb):
            col = f"((q % {nb4}) & 1) * {g.bn // 2} + ((q % {nb4}) >> 1) * 4" if split else f"(q % {nb4}) * 4"
            out.append(f"      {gb}{{ const int q = hl_tid + {q * g.threads}; hl_cp16(&hl_Bs[{sexpr}][q / {nb4}]"
                       f"[{col}], hl_B + ({kexpr} * {g.bk} + q / {nb4}) * {g.n} + (q % {nb4}) * 4); }}")
        return out

    def bfrag(name: str, row: str) -> list[str]:
        bases = ((0, "hl_c0 / 2"), (4, f"{g.bn // 2} + hl_c0 / 2")) if split else \
            [(v, f"hl_c0 + {v}") for v in range(0, g.nr, 4)]
        out = []
        if g.nr % 4:
            return [f"      {name}[{v}] = hl_Bs[hl_cur][{row}][hl_c0 + {v}];" for v in range(g.nr)]
        for v, base in bases:
            out.append(f"      {{ const float4 t = *(const float4*)&hl_Bs[hl_cur][{row}][{base}]; {name}[{v}] = t.x; "
                       f"{name}[{v + 1}] = t.y; {name}[{v + 2}] = t.z; {name}[{v + 3}] = t.w; }}")
        return out

    fma = f"{acc}[i * {g.nr} + j] = {acc}[i * {g.nr} + j] + "
    if g.a_row:   # per 4 k values: B's 4 rows in registers, then per row of A one float4
        compute = [f"    for (int hl_k4 = 0; hl_k4 < {g.bk}; hl_k4 += 4) {{",
                   f"      float hl_b[4][{g.nr}];"]
        for u in range(4):
            compute += bfrag(f"hl_b[{u}]", f"hl_k4 + {u}")
        compute += ["      #pragma unroll",
                    f"      for (int i = 0; i < {g.mr}; ++i) {{",
                    "        const float4 hl_a = *(const float4*)&hl_As[hl_cur][hl_r0 + i][hl_k4];",
                    *[x for u, c in enumerate("xyzw") for x in (
                        "        #pragma unroll",
                        f"        for (int j = 0; j < {g.nr}; ++j) {fma}hl_a.{c} * hl_b[{u}][j];")],
                    "      }",
                    "    }"]
    else:
        compute = [f"    for (int hl_kk = 0; hl_kk < {g.bk}; ++hl_kk) {{",
                   f"      float hl_a[{g.mr}];"]
        if g.mr % 4 == 0:
            for v in range(0, g.mr, 4):
                compute.append(f"      {{ const float4 t = *(const float4*)&hl_As[hl_cur][hl_kk][hl_r0 + {v}]; "
                               f"hl_a[{v}] = t.x; hl_a[{v + 1}] = t.y; hl_a[{v + 2}] = t.z; hl_a[{v + 3}] = t.w; }}")
        else:
            compute += [f"      hl_a[{v}] = hl_As[hl_cur][hl_kk][hl_r0 + {v}];" for v in range(g.mr)]
        compute += [f"      float hl_b[{g.nr}];", *bfrag("hl_b", "hl_kk"),
                    "      #pragma unroll",
                    f"      for (int i = 0; i < {g.mr}; ++i) {{",
                    "        #pragma unroll",
                    f"        for (int j = 0; j < {g.nr}; ++j) {fma}hl_a[i] * hl_b[j];",
                    "      }",
                    "    }"]
    return o + _cp_async_ring(st, kt, issue, ["    #pragma unroll", *compute])


# ----------------------------------------------------------------------------- GEMM template on tensor cores

#: a K-tile loop with the pragma ("tensor_core", P), P in MMA_PASSES, runs the GEMM template on tensor cores
#: (`_gemm_mma_text`) where its tiling fits (`_mma_fits`), else the FFMA template; off: always FFMA (benchmarks)
GEMM_MMA = True
MMA_PASSES = (1, 3)     # 3: 3xTF32 (float32-class error), 1: plain TF32 (for comparison only)
GEMM_MMA_STAGES = 3     # the mma template's cp.async ring (fewer where they would not fit in GEMM_MMA_SHARED_LIMIT)
#: shared-memory bytes the mma template's ring may take: above STATIC_SHARED_LIMIT (48 KB) the kernel's shared
#: memory is dynamic (`extern __shared__`, the launch sets the function's MAX_DYNAMIC_SHARED_SIZE_BYTES; the H200
#: allows 227 KB per block, 228 KB per SM): 112 KB keeps two blocks per SM.  Used by BK 32 tiles (session 8: 4x8 on
#: 32x4 threads, BK 32, 3 stages, 67.6 KB: matmul 1024^3 39.8k GFLOP/s against 37.6-38.0k at BK 16 in two calls);
#: STATIC_SHARED_LIMIT: static arrays only (session 5)
GEMM_MMA_SHARED_LIMIT = 112 * 1024
#: 3xTF32: each 8-k step's three products summed by the tensor cores into a zeroed fragment, then added to the
#: accumulators by FADD (round to nearest).  The tensor cores' own accumulation does not round to nearest (it
#: truncates), so summing straight into the running accumulators biases the result by up to 3 x K / 8 truncations of
#: |acc|: on the H200, N(0, 1) inputs, max error / max |C| 8.9e-6 at K = 1024 and 3.2e-5 at K = 4096 against 1.4e-6 /
#: 2.8e-6 for the FFMA template (off: straight into the accumulators, for comparison)
GEMM_MMA_SPLIT_ACC = True
#: B split once per block instead of once per warp: after the cp.async wait the block converts the stage's B tile in
#: place into its big TF32 words and (3xTF32) writes the small ones to one more shared plane, a barrier, then the
#: fragments load ready TF32 words (off: every warp splits the whole B tile it reads, 4x redundant with 4 warps).
#: Off by default: correct, but 4-15 % slower on the H200 (the extra barrier and twice the B fragment loads cost more
#: than the conversions saved; docs/gpu.md, session 5b)
GEMM_MMA_B_PLANES = False
#: 3xTF32 with GEMM_MMA_SPLIT_ACC: both 8-k steps of a 16-k chunk (6 products) summed in one zeroed fragment before
#: the FADD into the accumulators (half the FADDs; both steps' fragments live; H200 matmul 4096^3 47.2k -> 51.5k
#: GFLOP/s, error 9.6e-7 -> 7.7e-7); off: one fragment per 8-k step (session 5)
GEMM_MMA_PAIR_STEPS = True
#: 3xTF32: the small part passed to the mma unrounded (x - big, exact in float32; the tensor cores read the TF32 bits
#: of it, truncating the rest), one conversion fewer per operand value (`hl_split_tf32_t`; |x - big| has at most 12
#: significant bits, so the error magnitude is the rounded one's).  Off: rounded (cvt.rna); on the H200 (session 8)
#: level or up to 5 % slower (240 -> 218 registers at 4x16)
GEMM_MMA_SMALL_TRUNC = False
#: BK > 16: the 16-k chunks of a K tile as a loop that is not unrolled (`#pragma unroll 1`, chunk offset hl_kc), so
#: that nvcc cannot hoist the next chunk's shared loads and conversions into the current one (unrolled, BK 32 takes
#: 255 registers and spills at 4x16 per thread, 209 instead of 145 at 4x8).  Off: the chunks unrolled; the loop (no
#: spill, 167 registers at 4x8) was 2-6 % slower on the H200 in 9 of 10 cases (session 8)
GEMM_MMA_CHUNK_LOOP = False
#: session 9 (issue #7): 3xTF32 dots on Hopper's warpgroup MMA (`cuda_wgmma`: wgmma.mma_async m64nNk8 with A split in
#: registers, B split once per block into swizzled K-major TF32 planes; sm_90a only, `cuda_runtime.compile_cubin`
#: picks sm_90a for such texts) for the tilings it takes (`wgmma_fits`: MR 2, NR 16 / 32, TJ 4, BK 32, 128 or 256
#: threads; the schedule's `TENSOR_CORE_WGMMA` tiles), a ring of GEMM_WGMMA_STAGES raw stages within
#: GEMM_WGMMA_SHARED_LIMIT bytes of dynamic shared memory (the H200 allows 227 KB per block).  H200 (docs/gpu.md,
#: session 9, logs/gpu_s9w/call4, cuBLAS float32 interleaved): 4096^3 149.9 % of cuBLAS (75.9k GFLOP/s; the mma
#: template 100.9 %), rmsnorm_swiglu's dots 159.5 % / 161.4 %; error at 4096^3 6.1e-7 (mma 7.5e-7); off: the mma
#: template
GEMM_WGMMA = True
GEMM_WGMMA_STAGES = 4
GEMM_WGMMA_SHARED_LIMIT = 220 * 1024

#: sm_80+ tensor-core helpers (added to a module's prelude only when a kernel uses them).  hl_split_tf32: x = big +
#: small with big = x rounded to TF32 (nearest, ties away: cvt.rna), small = (x - big) rounded to TF32 (x - big is
#: exact in float32).  hl_mma_tf32: D = A (16x8) B (8x8) + C on one warp, fragments in the PTX ISA layout of
#: mma.m16n8k8 .tf32 (g = lane / 4, t = lane % 4; a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
#: b0 (k t, n g), b1 (k t + 4, n g); c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)).  Below sm_80
#: the same sums by warp shuffles and FFMA (not fast; never measured).
MMA_PRELUDE = r"""
HL_INL unsigned hl_tf32(float x) {
#if __CUDA_ARCH__ >= 800
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x)); return r;
#else
  const unsigned b = __float_as_uint(x);
  return ((b & 0x7f800000u) == 0x7f800000u) ? b : ((b + 0x1000u) & 0xffffe000u);
#endif
}
HL_INL void hl_split_tf32(float x, unsigned& big, unsigned& small) {
  big = hl_tf32(x);
  small = hl_tf32(x - __uint_as_float(big));
}
HL_INL void hl_split_tf32_t(float x, unsigned& big, unsigned& small) {   // small left for the mma to truncate
  big = hl_tf32(x);
  small = __float_as_uint(x - __uint_as_float(big));
}
HL_INL void hl_mma_tf32(float& c0, float& c1, float& c2, float& c3, unsigned a0, unsigned a1, unsigned a2,
                        unsigned a3, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n" : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  const int l = threadIdx.x & 31, g = l >> 2, t = l & 3;
  for (int k = 0; k < 4; ++k) {
    const float x0 = __uint_as_float(__shfl_sync(0xffffffffu, a0, g * 4 + k));
    const float x1 = __uint_as_float(__shfl_sync(0xffffffffu, a1, g * 4 + k));
    const float x2 = __uint_as_float(__shfl_sync(0xffffffffu, a2, g * 4 + k));
    const float x3 = __uint_as_float(__shfl_sync(0xffffffffu, a3, g * 4 + k));
    const float y00 = __uint_as_float(__shfl_sync(0xffffffffu, b0, 8 * t + k));
    const float y01 = __uint_as_float(__shfl_sync(0xffffffffu, b0, 8 * t + 4 + k));
    const float y10 = __uint_as_float(__shfl_sync(0xffffffffu, b1, 8 * t + k));
    const float y11 = __uint_as_float(__shfl_sync(0xffffffffu, b1, 8 * t + 4 + k));
    c0 += x0 * y00 + x2 * y10; c1 += x0 * y01 + x2 * y11; c2 += x1 * y00 + x3 * y10; c3 += x1 * y01 + x3 * y11;
  }
#endif
}
"""


def _mma_fits(g: _Gemm) -> bool:
    """The mma template's tiling: 4 thread columns (TJ = 4: a warp is 8 thread rows x 4 thread columns, the mma
    fragment's groupID x threadID_in_group), MR even (two rows per m16 fragment), NR 8 or 16 (B's shared rows
    swizzled in 16-byte chunks), BK a multiple of 16 (each thread reads 4 consecutive k of A as one float4), whole
    warps, and a ring of at least 2 stages within 48 KB."""
    if g.bn // g.nr != 4 or g.mr % 2 or g.nr not in (8, 16) or g.bk % 16 or g.threads % 32:
        return False
    return _mma_gemm(g, 3).stages >= 2


def _mma_pad_a(mr: int, bk: int) -> int:
    """Padding of A's shared rows (a multiple of 4 floats, 16-byte rows) so that the float4 reads of a quarter
    warp (thread rows g, g + 1: MR rows apart) fall in different banks: MR (BK + pad) = 16 mod 32 where possible."""
    return next((p for p in range(4, 36, 4) if mr * (bk + p) % 32 == 16), 4)


def _mma_gemm(g: _Gemm, passes: int) -> _Gemm:
    g = dataclasses.replace(g, mma=passes, pad_a=_mma_pad_a(g.mr, g.bk), a_row=True, stages=0)
    fixed = g.shared_bytes      # B's small plane (`GEMM_MMA_B_PLANES`)
    per_stage = dataclasses.replace(g, stages=1).shared_bytes - fixed
    limit = min(GEMM_MMA_SHARED_LIMIT, _shared_cap())
    return dataclasses.replace(g, stages=max(0, min(GEMM_MMA_STAGES, (limit - fixed) // per_stage, g.k // g.bk + 1)))


def _mma_big_regs(g: _Gemm) -> bool:
    """Whether an mma kernel needs more than 128 registers per thread at two blocks per SM (more than 128 threads
    with at least 32 accumulators): its launch bounds then ask for one block per SM (255 registers)."""
    return g.threads > 128 and g.mr * g.nr >= 32


def _mma_shared_decls(g: _Gemm, st: int, plane: bool) -> list[str]:
    """The mma template's shared tiles: static arrays, or (g.smem_off >= 0) pointers into the kernel's dynamic
    shared memory `hl_smem` with the same shapes (the same indexing)."""
    ap, bn = g.bk + g.pad_a, g.bn
    if g.smem_off < 0:
        return [f"  __shared__ __align__(16) float hl_As[{st}][{g.bm}][{ap}];",
                f"  __shared__ __align__(16) float hl_Bs[{st}][{g.bk}][{bn}];",
                *([f"  __shared__ __align__(16) unsigned hl_Bsm[{g.bk}][{bn}];   // B's small TF32 words"]
                  if plane else [])]
    a_off, b_off = g.smem_off, g.smem_off + 4 * st * g.bm * ap
    out = [f"  float (*hl_As)[{g.bm}][{ap}] = reinterpret_cast<float (*)[{g.bm}][{ap}]>(hl_smem + {a_off});",
           f"  float (*hl_Bs)[{g.bk}][{bn}] = reinterpret_cast<float (*)[{g.bk}][{bn}]>(hl_smem + {b_off});"]
    if plane:
        out.append(f"  unsigned (*hl_Bsm)[{bn}] = reinterpret_cast<unsigned (*)[{bn}]>(hl_smem + "
                   f"{b_off + 4 * st * g.bk * bn});   // B's small TF32 words")
    return out


def mma_index_exprs(g: _Gemm) -> dict:
    """The index expressions of `_gemm_mma_text` (C text, also valid Python for non-negative ints once `/` is
    read as `//`), which the template is built from: thread variables (hl_g, hl_t, hl_r0, hl_bsw, hl_bc<v>),
    the copies (chunk q of a tile: A at [a_row][a_col], B at [b_row][b_col]), the fragments (per 16-k chunk c and
    8-k step s: A row i at column a_frag_col(c); B at row b_frag_row(c, s, e) column hl_bc<v>; A registers a0..a3
    from the float4 of rows 2 mi, 2 mi + 1), the accumulator of each of c0..c3 (over hl_mi, hl_ni) and, with
    `GEMM_MMA_B_PLANES`, the chunk a thread converts (b_conv: 16-byte chunk q of the stage's B tile, converted in
    place; b_small: the chunk of the small plane its small words go to)."""
    nr, mr, bk, bn = g.nr, g.mr, g.bk, g.bn
    ka, nb4 = bk // 4, bn // 4
    d = nr // 8          # chunks between the B fragment columns of thread rows g and g + 1

    def swz(t: str) -> str:   # XOR of B's chunks in row 4 t + 0..3 (mod 16): 4 distinct values apart from d
        return f"(({t}) << 1)" if d == 1 else f"((({t}) & 1) | ((({t}) & 2) << 1))"

    half = nr // 2
    return {
        "g": "(hl_tid & 31) >> 2", "t": "hl_tid & 3", "r0": f"(hl_tid >> 2) * {mr}",
        "bsw": swz("hl_t"),
        "bc": [f"((((hl_g >> 1) * {nr // 4} + (hl_g & 1) * {d} + {v}) ^ hl_bsw) * 4)" for v in range(nr // 8)],
        "a_row": f"q / {ka}", "a_col": f"(q % {ka}) * 4",
        "b_row": f"q / {nb4}", "b_col": f"(((q % {nb4}) ^ {swz(f'(q / {nb4} >> 2) & 3')}) * 4)",
        "a_frag_row": "hl_r0 + {i}", "a_frag_col": "{c16} + hl_t * 4", "b_conv": "q", "b_small": "q",
        "b_frag_row": "{k0} + hl_t * 4",
        "a_regs": {"a0": ("2 * hl_mi", 0), "a1": ("2 * hl_mi + 1", 0), "a2": ("2 * hl_mi", 1),
                   "a3": ("2 * hl_mi + 1", 1)},
        "acc": {"c0": f"2 * hl_mi * {nr} + hl_ni", "c1": f"2 * hl_mi * {nr} + {half} + hl_ni",
                "c2": f"(2 * hl_mi + 1) * {nr} + hl_ni", "c3": f"(2 * hl_mi + 1) * {nr} + {half} + hl_ni"},
    }


def _k0(c: int | str, off: int) -> str:
    """k offset `off` within 16-k chunk `c` of a K tile: c an int (chunks unrolled) or the chunk loop's variable."""
    return str(16 * c + off) if isinstance(c, int) else f"{c} + {off}"


def _gemm_mma_text(g: _Gemm, acc: str, a: str, b: str) -> list[str]:
    """The GEMM template on tensor cores (mma.sync m16n8k8, TF32 in, float32 accumulate), `g.mma` = 3: 3xTF32
    (each operand split into big + small TF32 parts; small x big, big x small, big x big accumulated in that order,
    small x small dropped; per 8-k step, or per 16-k chunk with `GEMM_MMA_PAIR_STEPS`, into a zeroed fragment added
    to the accumulators by FADD, `GEMM_MMA_SPLIT_ACC`), 1: plain TF32.  B is split by each warp as it loads its
    fragments, or with `GEMM_MMA_B_PLANES` once per block after the wait (in place + a small plane, one more barrier).
    The ring's tiles are static arrays, or pointers into the kernel's dynamic shared memory when it passes 48 KB
    (`GEMM_MMA_SHARED_LIMIT`, `_mma_shared_decls`).  Copies: the cp.async ring of `_gemm_async_text` (A row-major
    with padded rows, B row-major with its 16-byte chunks XOR-swizzled per 4 rows).  Thread tid = 32 w + 4 g + t
    (TJ = 4) owns rows r0 = (tid / 4) MR + [0, MR) and columns t NR + [0, NR), as the loop nest says; its
    accumulators are the loop nest's own (acc[i NR + j]) used directly as mma C fragments: fragment row g (g + 8) of
    m-tile mi is tile row (8 w + g) MR + 2 mi (+ 1), fragment column 2 t' + e of n-tile ni is tile column
    t' NR + e NR / 2 + ni, so each thread's four C registers are its own acc[2 mi NR + ni], acc[2 mi NR + NR/2 + ni],
    acc[(2 mi + 1) NR + ni], acc[(2 mi + 1) NR + NR/2 + ni].  K: per 16-k chunk, fragment column t (t + 4) of step s
    is k = 4 t + 2 s (+ 1), so a thread's A values of a row are one float4 (its 4 k) and its B values two rows of
    NR / 2 consecutive columns (`GEMM_MMA_CHUNK_LOOP`: the chunks of a BK > 16 tile in a loop, not unrolled).  The
    sums over k run in another order than the FFMA template's (and through the tensor cores).  `g.wgmma`: the
    warpgroup-MMA template of `cuda_wgmma` instead."""
    if g.wgmma:
        return wgmma_text(g, acc, a, b, _gemm_block_pointers(g, a, b))
    e = mma_index_exprs(g)
    na, nb = g.bm * g.bk // 4, g.bk * g.bn // 4
    la, lb = max(1, na // g.threads), max(1, nb // g.threads)
    ga = f"if (hl_tid < {na}) " if na < g.threads else ""
    gb = f"if (hl_tid < {nb}) " if nb < g.threads else ""
    st, kt = g.stages, g.k // g.bk
    half, nv = g.nr // 2, g.nr // 8
    three = g.mma == 3
    planes = GEMM_MMA_B_PLANES
    split, tf32 = "hl_split_tf32_t" if GEMM_MMA_SMALL_TRUNC else "hl_split_tf32", "hl_tf32"
    o = [f"{{  // GEMM template: {g.bm}x{g.bn}x{g.bk} tile, {g.mr}x{g.nr} per thread, "
         f"{'3xTF32' if g.mma == 3 else 'TF32'} tensor cores (mma.sync m16n8k8), {st}-stage cp.async ring",
         *_mma_shared_decls(g, st, planes and three),
         *_gemm_block_pointers(g, a, b),
         f"  const int hl_g = {e['g']}, hl_t = {e['t']};",
         f"  const int hl_r0 = {e['r0']};",
         f"  const int hl_bsw = {e['bsw']};",
         "  const int " + ", ".join(f"hl_bc{v} = {x}" for v, x in enumerate(e["bc"])) + ";"]

    def issue(kexpr: str, sexpr: str) -> list[str]:
        out = []
        for q in range(la):
            out.append(f"      {ga}{{ const int q = hl_tid + {q * g.threads}; hl_cp16(&hl_As[{sexpr}][{e['a_row']}]"
                       f"[{e['a_col']}], hl_A + ({e['a_row']}) * {g.ka} + {kexpr} * {g.bk} + {e['a_col']}); }}")
        for q in range(lb):
            out.append(f"      {gb}{{ const int q = hl_tid + {q * g.threads}; hl_cp16(&hl_Bs[{sexpr}][{e['b_row']}]"
                       f"[{e['b_col']}], hl_B + ({kexpr} * {g.bk} + {e['b_row']}) * {g.n} + (q % {g.bn // 4}) * 4); }}")
        return out

    def convert() -> list[str]:   # the stage's B tile in place -> big TF32 words (+ the small plane), once per block
        out = ["    {  // B -> TF32 words, once per block"]
        for q in range(lb):
            out.append(f"      {gb}{{ const int q = hl_tid + {q * g.threads};")
            out.append(f"        float4* hl_p = (float4*)&hl_Bs[hl_cur][0][0] + {e['b_conv']};")
            out.append("        const float4 f = *hl_p; uint4 hl_w;")
            if three:
                out += ["        uint4 hl_s;",
                        *[f"        {split}(f.{c}, hl_w.{c}, hl_s.{c});" for c in "xyzw"],
                        f"        ((uint4*)&hl_Bsm[0][0])[{e['b_small']}] = hl_s;"]
            else:
                out += [f"        hl_w.{c} = {tf32}(f.{c});" for c in "xyzw"]
            out.append("        *(uint4*)hl_p = hl_w;")
            out.append("      }")
        return out + ["    }", "    __syncthreads();"]

    ar = e["a_regs"]
    cacc = [f"{acc}[{e['acc'][c_]}]" for c_ in ("c0", "c1", "c2", "c3")]
    part = three and GEMM_MMA_SPLIT_ACC
    # 8-k steps whose products share one zeroed fragment (`GEMM_MMA_PAIR_STEPS`: both steps of a 16-k chunk)
    groups = ((0, 1),) if part and GEMM_MMA_PAIR_STEPS else ((0,), (1,))

    def b_frags(c: int | str, s: int) -> list[str]:     # step s's B fragments: hl_b<e>[_s]<s> (e: k row t, t + 4)
        out = []
        regs = [f"hl_b{ee}{sm}{s}" for sm in (("", "s_") if three else ("",)) for ee in range(2)]
        out.append("        unsigned " + ", ".join(f"{r}[{half}]" for r in regs) + ";")
        for ee in range(2):
            row = e["b_frag_row"].format(k0=_k0(c, 2 * s + ee))
            big, small = f"hl_b{ee}{s}", f"hl_b{ee}s_{s}"
            for v in range(nv):
                if planes:      # ready TF32 words (big in the stage, small in the plane)
                    out.append(f"        {{ const uint4 f = *(const uint4*)&hl_Bs[hl_cur][{row}][hl_bc{v}];")
                    if three:
                        out.append(f"          const uint4 fs = *(const uint4*)&hl_Bsm[{row}][hl_bc{v}];")
                    for x, comp in enumerate("xyzw"):
                        j = 4 * v + x
                        out.append(f"          {big}[{j}] = f.{comp};" + (f" {small}[{j}] = fs.{comp};"
                                                                           if three else ""))
                    out.append("        }")
                    continue
                out.append(f"        {{ const float4 f = *(const float4*)&hl_Bs[hl_cur][{row}][hl_bc{v}];")
                for x, comp in enumerate("xyzw"):
                    j = 4 * v + x
                    out.append(f"          {split}(f.{comp}, {big}[{j}], {small}[{j}]);" if three else
                               f"          {big}[{j}] = {tf32}(f.{comp});")
                out.append("        }")
        return out

    def a_frags(s: int) -> list[str]:     # step s's A fragments of m-tile hl_mi: hl_a<r><s>, hl_a<r>s_<s>
        lo, hi = ("x", "y") if s == 0 else ("z", "w")
        if three:
            return ["          unsigned " + ", ".join(f"hl_{r}{s}, hl_{r}s_{s}" for r in ar) + ";",
                    *[f"          {split}(hl_fa[{row}].{(lo, hi)[hl]}, hl_{r}{s}, hl_{r}s_{s});"
                      for r, (row, hl) in ar.items()]]
        return [f"          const unsigned hl_{r}{s} = {tf32}(hl_fa[{row}].{(lo, hi)[hl]});"
                for r, (row, hl) in ar.items()]

    def mmas(s: int, cs: str) -> list[str]:
        big = ", ".join(f"hl_{r}{s}" for r in ar)
        bb = f"hl_b0{s}[hl_ni], hl_b1{s}[hl_ni]"
        out = []
        if three:
            out += [f"            hl_mma_tf32({cs}, {', '.join(f'hl_{r}s_{s}' for r in ar)}, {bb});",
                    f"            hl_mma_tf32({cs}, {big}, hl_b0s_{s}[hl_ni], hl_b1s_{s}[hl_ni]);"]
        return out + [f"            hl_mma_tf32({cs}, {big}, {bb});"]

    looped = GEMM_MMA_CHUNK_LOOP and g.bk > 16
    chunks = ("hl_kc",) if looped else range(g.bk // 16)
    compute = ["    #pragma unroll 1", f"    for (int hl_kc = 0; hl_kc < {g.bk}; hl_kc += 16)"] if looped else []
    for c in chunks:
        compute.append(f"    {{  // k {_k0(c, 0)} .. {_k0(c, 15)} of the tile")
        compute.append(f"      float4 hl_fa[{g.mr}];")
        for i in range(g.mr):
            compute.append(f"      hl_fa[{i}] = *(const float4*)&hl_As[hl_cur][{e['a_frag_row'].format(i=i)}]"
                           f"[{e['a_frag_col'].format(c16=_k0(c, 0))}];")
        for grp in groups:
            compute.append("      {  // " + ", ".join(f"step {s}: fragment column t (t + 4) is k {_k0(c, 2 * s)} + "
                                                      "4 t (+ 1)" for s in grp))
            for s_ in grp:
                compute += b_frags(c, s_)
            compute += ["        #pragma unroll",
                        f"        for (int hl_mi = 0; hl_mi < {g.mr // 2}; ++hl_mi) {{"]
            for s_ in grp:
                compute += a_frags(s_)
            compute += ["          #pragma unroll",
                        f"          for (int hl_ni = 0; hl_ni < {half}; ++hl_ni) {{"]
            cs = ", ".join(cacc)
            if part:    # the steps' products into a zeroed fragment, then added to the accumulators (FADD, RN)
                compute.append("            float hl_p0 = 0.0f, hl_p1 = 0.0f, hl_p2 = 0.0f, hl_p3 = 0.0f;")
                cs = "hl_p0, hl_p1, hl_p2, hl_p3"
            for s_ in grp:
                compute += mmas(s_, cs)
            if part:
                compute += [f"            {x} = {x} + hl_p{q};" for q, x in enumerate(cacc)]
            compute += ["          }", "        }", "      }"]
        compute.append("    }")
    return o + _cp_async_ring(st, kt, issue, [*(convert() if planes else []), *compute])


# ----------------------------------------------------------------------------- implicit-GEMM template

#: the implicit-GEMM template replaces the generic code of a matching register-tiled K-tile loop that has no
#: shared fetch stages (a convolution reading through an inlined pad: its A operand is an expression of the
#: output pixel and k, evaluated on the fly by the cooperative fetch); benchmarks switch it off to compare
IGEMM_TEMPLATE = True
_KX, _P, _Q, _C, _G, _V = (Var(n, INDEX) for n in ("hl_kx", "hl_p", "hl_q", "hl_c", "hl_g", "hl_v"))


@dataclass(frozen=True)
class _IGemm:
    """What the implicit-GEMM template needs of one K-tile loop (see `_igemm_info`): the operands as expressions
    of their tile position (A over hl_p, hl_q; B over hl_q, hl_c; both over the K tile hl_kx and the block
    variables), each fetched with float4 loads along `a_fast` / `b_fast` when `a_vec` / `b_vec`."""

    acc: str
    kt: int
    bm: int
    bn: int
    bk: int
    mr: int
    nr: int
    threads: int
    tj: int
    a: Expr
    b: Expr
    a_fast: str     # "q" (consecutive k) or "o" (consecutive rows)
    a_vec: bool
    b_fast: str     # "o" (consecutive columns) or "q"
    b_vec: bool
    tid: str = ""   # the thread loop's variable and the accumulator's shape (`igemm_loop_nest`)
    acc_shape: tuple[int, ...] = ()

    @property
    def shared_bytes(self) -> int:
        return 4 * 2 * self.bk * (self.bm + 4 + self.bn)


def _digits(loops: list[For], x: Expr) -> dict[str, Expr]:
    """Loop var -> its digit of the row-major combined index `x` over `loops` (nest order)."""
    out: dict[str, Expr] = {}
    inner = 1
    for f in reversed(loops):
        d = x if inner == 1 else Binary(Op.DIVIDE, x, Const(inner, INDEX), INDEX)
        out[f.var.name] = d if f is loops[0] else Binary(Op.REMAINDER, d, Const(int(f.const_extent), INDEX), INDEX)
        inner *= int(f.const_extent)
    return out


def _digit_values(loops: list[For], x: int) -> dict[str, int]:
    out = {}
    for f in reversed(loops):
        x, out[f.var.name] = divmod(x, int(f.const_extent))
    return out


def _tid_uses(e: Expr, tid: str, op: Op, bare: int) -> list[int]:
    """The constants c of every `tid / c` (op DIVIDE) or `tid % c` (REMAINDER) in `e`; `bare` for every other
    occurrence of the thread variable (tid = tid / 1 = tid % T)."""
    cs: list[int] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if (isinstance(x, Binary) and x.op is op and isinstance(x.a, Var) and x.a.name == tid
                and isinstance(x.b, Const) and int(x.b.value) > 0):
            cs.append(int(x.b.value))
            continue
        if isinstance(x, Var) and x.name == tid:
            cs.append(bare)
        stack.extend(children(x))
    return cs


def _replace_tid(e: Expr, tid: str, op: Op, by: Expr, tj: int) -> Expr:
    """`tid / c` -> by / (c / TJ) (op DIVIDE: `by` is tid / TJ, TJ divides c) or `tid % c` -> by % c (REMAINDER:
    `by` is tid % TJ, c divides TJ); a bare tid -> by (DIVIDE: TJ is 1; REMAINDER: TJ is T)."""
    def fn(x: Expr) -> Expr:
        if (isinstance(x, Binary) and x.op is op and isinstance(x.a, Var) and x.a.name == tid
                and isinstance(x.b, Const)):
            c = int(x.b.value) // tj if op is Op.DIVIDE else int(x.b.value)
            if (op is Op.DIVIDE and c == 1) or (op is Op.REMAINDER and c == tj):
                return by
            return Binary(op, by, Const(c, INDEX), INDEX)
        return x
    return substitute(rebuild(e, fn), {tid: by})


def _cond_lane_invariant(c: Expr, v: str) -> bool:
    """`c` has the same value for every lane v in [0, 4): its index compares are of lane-invariant operands."""
    if v not in _vars(c):
        return True
    if isinstance(c, Compare):
        fa, fb = _lane_form(c.a, v, 4), _lane_form(c.b, v, 4)
        return fa is not None and fb is not None and fa[1] == 0 and fb[1] == 0
    if isinstance(c, Binary) and c.dtype is DType.PRED and c.op in (Op.AND, Op.OR):
        return _cond_lane_invariant(c.a, v) and _cond_lane_invariant(c.b, v)
    if isinstance(c, Unary) and c.op is Op.NOT:
        return _cond_lane_invariant(c.a, v)
    return False


def _vector_operand(e: Expr) -> tuple[Expr | None, Load, Expr | None] | None:
    """(cond, load, other) of `select(cond, load, other const)` or (None, load, None) of a plain load."""
    if isinstance(e, Load):
        return None, e, None
    if isinstance(e, Select) and isinstance(e.t, Load) and isinstance(e.f, Const):
        return e.cond, e.t, e.f
    return None


def _vec_ok(e: Expr, var: Var, bufs: dict) -> bool:
    """With `var` = 4 g + v (g any group, v the lane in [0, 4)), `e` is a float32 load (through a select whose
    condition is the same for every lane, other value a constant) of 4 consecutive elements, the first a multiple
    of 4 (a float4 load, given 16-byte aligned buffers)."""
    x = substitute(e, {var.name: Binary(Op.ADD, Binary(Op.MULTIPLY, _G, Const(4, INDEX), INDEX), _V, INDEX)})
    parts = _vector_operand(x)
    if parts is None:
        return False
    cond, ld, _ = parts
    d = bufs.get(ld.buffer)
    if d is None or d.scope != "global" or d.dtype is not DType.F32:
        return False
    acc = _vector_access(ld.indices, d.shape, _V.name, 4)
    return acc is not None and acc[1] == 1 and (cond is None or _cond_lane_invariant(cond, _V.name))


def _igemm_info(s: For, bufs: dict, plan: _KernelPlan, bids: list[str], tid: str,
                written: set[str]) -> _IGemm | None:
    """The implicit-GEMM template's parameters when the serial loop `s` (under block and thread loops only, in a
    1-D grid of 1-D blocks of T threads) is a register-tiled K-tile loop: loops over q (the K step: BK), i (rows:
    MR) and j (columns: NR) around the one store acc[I(i, j)] = acc[I(i, j)] + A * B, where acc is the thread's
    local float32 tile with I(i, j) = i * NR + j (checked over all (i, j)), A reads only the block variables, s,
    q, i and the thread variable as `tid / c` (c a multiple of TJ), B only the block variables, s, q, j and
    `tid % c` (c dividing TJ), both read global buffers the kernel does not write.  A then depends on the thread
    only through tid / TJ and B through tid % TJ (exactly), so a block's (BM = T / TJ * MR, BK) tile of A and
    (BK, BN = TJ * NR) tile of B can be fetched cooperatively (each element evaluated once, at the iteration that
    reads it) and the sums taken in the same order."""
    if not IGEMM_TEMPLATE or plan.stride_x or plan.block[1:] != [1, 1] or plan.grid[1:] != [1, 1]:
        return None
    if s.kind is not ForKind.SERIAL or s.const_extent is None or not (isinstance(s.min, Const) and s.min.value == 0):
        return None
    try:
        if any(isinstance(a, Allocate | Barrier) for a in walk_stmts(s.body)):
            return None
        paths = list(_store_paths(s.body))
    except _NoMatch:
        return None
    if len(paths) != 1:
        return None
    st, cloops = paths[0]
    v = st.value
    acc = bufs.get(st.buffer)
    if not (acc is not None and acc.scope == "local" and acc.dtype is DType.F32 and isinstance(v, Binary)
            and v.op is Op.ADD and isinstance(v.a, Load) and v.a.buffer == st.buffer and v.a.indices == st.indices
            and isinstance(v.b, Binary) and v.b.op is Op.MULTIPLY and v.b.dtype is DType.F32):
        return None
    cvars = [f.var.name for f in cloops]
    avars = set().union(*(_vars(x) for x in st.indices)) if st.indices else set()
    if not avars <= set(cvars) or len(set(cvars)) != len(cvars):
        return None
    for x, y in ((v.b.a, v.b.b), (v.b.b, v.b.a)):
        g = _igemm_try(s, x, y, st, acc, cloops, avars, bufs, plan, bids, tid, written)
        if g is not None:
            return g
    return None


def _igemm_try(s: For, a: Expr, b: Expr, st: Store, acc, cloops: tuple[For, ...], avars: set[str], bufs: dict,
               plan: _KernelPlan, bids: list[str], tid: str, written: set[str]) -> _IGemm | None:
    va, vb = _vars(a), _vars(b)
    rows = [f for f in cloops if f.var.name in avars and f.var.name in va and f.var.name not in vb]
    cols = [f for f in cloops if f.var.name in avars and f.var.name in vb and f.var.name not in va]
    ks = [f for f in cloops if f.var.name not in avars]
    if not ks or len(rows) + len(cols) != len(avars):
        return None
    common = set(bids) | {tid, s.var.name}
    rv, cv, kv = ({f.var.name for f in x} for x in (rows, cols, ks))
    if not va <= common | rv | kv or not vb <= common | cv | kv:
        return None
    for e in (a, b):
        for ld in walk(e):
            if isinstance(ld, Load):
                d = bufs.get(ld.buffer)
                if d is None or d.scope != "global" or ld.buffer in written:
                    return None
    t = plan.block[0]
    ca, cb = _tid_uses(a, tid, Op.DIVIDE, 1), _tid_uses(b, tid, Op.REMAINDER, t)
    tj = math.lcm(*cb) if cb else 1
    if t % tj or any(c % tj for c in ca):
        return None
    mr, nr, bk = (math.prod(int(f.const_extent) for f in x) for x in (rows, cols, ks))
    if math.prod(acc.shape) != mr * nr:
        return None
    for i in range(mr):    # the register tile: acc[I(i, j)] is element i * NR + j
        for j in range(nr):
            env = {**_digit_values(rows, i), **_digit_values(cols, j)}
            if _flat([_ival(x, env) for x in st.indices], acc.shape) != i * nr + j:
                return None
    bm, bn = t // tj * mr, tj * nr
    kx = {s.var.name: _KX}
    ea = _replace_tid(substitute(a, {**kx, **_digits(rows, Binary(Op.REMAINDER, _P, Const(mr, INDEX), INDEX)),
                                     **_digits(ks, _Q)}),
                      tid, Op.DIVIDE, Binary(Op.DIVIDE, _P, Const(mr, INDEX), INDEX), tj)
    eb = _replace_tid(substitute(b, {**kx, **_digits(cols, Binary(Op.REMAINDER, _C, Const(nr, INDEX), INDEX)),
                                     **_digits(ks, _Q)}),
                      tid, Op.REMAINDER, Binary(Op.DIVIDE, _C, Const(nr, INDEX), INDEX), tj)
    a_fast, a_vec = "q", False
    if bk % 4 == 0 and _vec_ok(ea, _Q, bufs):
        a_vec = True
    elif bm % 4 == 0 and _vec_ok(ea, _P, bufs):
        a_fast, a_vec = "o", True
    b_fast, b_vec = "o", False
    if bn % 4 == 0 and _vec_ok(eb, _C, bufs):
        b_vec = True
    elif bk % 4 == 0 and _vec_ok(eb, _Q, bufs):
        b_fast, b_vec = "q", True
    g = _IGemm(st.buffer, int(s.const_extent), bm, bn, bk, mr, nr, t, tj, ea, eb, a_fast, a_vec, b_fast, b_vec,
               tid, tuple(acc.shape))
    return g if g.shared_bytes <= STATIC_SHARED_LIMIT else None


def _igemm_as_loops(g: _IGemm) -> Stmt:
    """The loop nest the implicit-GEMM template computes for one thread, as loop IR: for every K tile, k step, row
    i and column j, acc[i * NR + j] += A(p, q) * B(q, c) with the template's operand expressions at p = (tid /
    TJ) * MR + i, c = (tid % TJ) * NR + j (what the thread reads from the shared tiles), in the same order."""
    kx, q, i, j = (Var(n, INDEX) for n in ("hl_kx", "hl_q", "hl_i", "hl_j"))
    tid = Var(g.tid, INDEX)

    def ic(v: int) -> Const:
        return Const(v, INDEX)

    p = Binary(Op.ADD, Binary(Op.MULTIPLY, Binary(Op.DIVIDE, tid, ic(g.tj), INDEX), ic(g.mr), INDEX), i, INDEX)
    c = Binary(Op.ADD, Binary(Op.MULTIPLY, Binary(Op.REMAINDER, tid, ic(g.tj), INDEX), ic(g.nr), INDEX), j, INDEX)
    flat = Binary(Op.ADD, Binary(Op.MULTIPLY, i, ic(g.nr), INDEX), j, INDEX)
    idx, inner = [], 1
    for n in reversed(g.acc_shape):
        d = flat if inner == 1 else Binary(Op.DIVIDE, flat, ic(inner), INDEX)
        idx.append(Binary(Op.REMAINDER, d, ic(n), INDEX))
        inner *= n
    idx_t = tuple(reversed(idx))
    prod = Binary(Op.MULTIPLY, substitute(g.a, {_P.name: p}), substitute(g.b, {_C.name: c}), DType.F32)
    body: Stmt = Store(g.acc, idx_t, Binary(Op.ADD, Load(g.acc, idx_t, DType.F32), prod, DType.F32))
    for v, n in ((j, g.nr), (i, g.mr), (q, g.bk), (kx, g.kt)):
        body = For(v, ic(0), ic(n), ForKind.SERIAL, body)
    return body


def igemm_loop_nest(func: LoopFunc) -> tuple[LoopFunc, int]:
    """(`func` with every K-tile loop that the implicit-GEMM template replaces rewritten as the loop nest the
    template computes (`_igemm_as_loops`), how many): run through the loop-IR interpreter, this checks the
    template's operand expressions and register mapping on the CPU."""
    temps: list[Allocate] = []
    found: dict[str, _IGemm] = {}
    kernels = _split_kernels(func.body, temps)
    params = {b.name: b for b in func.params}
    params.update({a.buffer: BufferDecl(a.buffer, a.shape, a.dtype, "global") for a in temps})
    for k, kern in enumerate(kernels):
        scal: dict = {n.buffer: params[n.buffer] for n in temps}
        scal.update({a.buffer: a for a in walk_stmts(kern) if isinstance(a, Allocate)})
        kern = _scalarize(kern, scal)
        plan = _plan(kern, f"k{k}")
        kern = _sync(kern, plan, f"k{k}")
        found.update({v: g for v, g in _gemm_loops(kern, params, plan).items() if isinstance(g, _IGemm)})

    def rw(s: Stmt) -> Stmt:
        if isinstance(s, For):
            if s.var.name in found and s.kind is ForKind.SERIAL:
                return _igemm_as_loops(found[s.var.name])
            return dataclasses.replace(s, body=rw(s.body))
        if isinstance(s, Seq):
            return Seq(tuple(rw(c) for c in s.body))
        if isinstance(s, Allocate):
            return dataclasses.replace(s, body=rw(s.body))
        if isinstance(s, If):
            return If(s.cond, rw(s.then), None if s.otherwise is None else rw(s.otherwise))
        return s

    return dataclasses.replace(func, body=rw(func.body)), len(found)


_NP_IOPS = {Op.ADD: np.add, Op.SUBTRACT: np.subtract, Op.MULTIPLY: np.multiply, Op.MINIMUM: np.minimum,
            Op.MAXIMUM: np.maximum}
AFFINE_POINTS = 1 << 18    # most points an operand offset is evaluated at (`_affine_offset`)


def _np_ival(e: Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    """An index expression over arrays of variable values; _NoMatch where a division meets a negative value."""
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Const) and e.dtype is INDEX:
        return np.int64(int(e.value))
    if isinstance(e, Binary) and e.dtype is INDEX:
        a, b = _np_ival(e.a, env), _np_ival(e.b, env)
        if e.op in _NP_IOPS:
            return _NP_IOPS[e.op](a, b)
        if e.op in (Op.DIVIDE, Op.REMAINDER) and isinstance(e.b, Const) and int(e.b.value) > 0:
            if np.any(a < 0):
                raise _NoMatch("negative dividend")
            return a // b if e.op is Op.DIVIDE else a % b
    raise _NoMatch(type(e).__name__)


def _affine_offset(ld: Load, shape: tuple[int, ...], ranges: dict[str, int]) -> Expr | None:
    """The flat element index of `ld` as c0 + sum(c_v * v) when it is exactly that at every point of `ranges`
    (var -> extent; every variable of the index must have one), evaluated at all of them; else None.  (A
    filter read through fused reduce axes: (k / 192) * 12288 + ((k / 64) % 3) * 4096 + (k % 64) * 64 + c is
    k * 64 + c.)"""
    flat: Expr = Const(0, INDEX)
    stride = 1
    for x, n in zip(reversed(ld.indices), reversed(shape)):
        flat = Binary(Op.ADD, flat, Binary(Op.MULTIPLY, x, Const(stride, INDEX), INDEX), INDEX)
        stride *= int(n)
    names = sorted(_vars(flat))
    if not set(names) <= set(ranges) or math.prod(ranges[v] for v in names) > AFFINE_POINTS:
        return None
    grids = np.meshgrid(*[np.arange(ranges[v], dtype=np.int64) for v in names], indexing="ij")
    env = dict(zip(names, grids))
    try:
        val = np.broadcast_to(_np_ival(flat, env), grids[0].shape if grids else ())
    except _NoMatch:
        return None
    zero = (0,) * len(names)
    c0 = int(val[zero])
    coef = [int(val[tuple(1 if j == i else 0 for j in range(len(names)))]) - c0 if ranges[v] > 1 else 0
            for i, v in enumerate(names)]
    fit = c0 + sum(c * g for c, g in zip(coef, grids))
    if not np.array_equal(val, fit):
        return None
    out: Expr = Const(c0, INDEX)
    for c, v in zip(coef, names):
        if c:
            out = Binary(Op.ADD, Binary(Op.MULTIPLY, Var(v, INDEX), Const(c, INDEX), INDEX), out, INDEX)
    return out


def igemm_text(g: _IGemm, acc: str, expr, offset, shape) -> list[str]:
    """CUDA C lines of the implicit-GEMM template (the GEMM template's double-buffered structure): each K tile,
    the block's threads evaluate the (BM, BK) tile of A and the (BK, BN) tile of B (`g.a`, `g.b` at each tile
    position; float4 loads where proven, at an affine offset where that is proven) into shared memory (A
    transposed), then acc[i * NR + j] += A[r0 + i, kk] * B[kk, c0 + j] with r0 = (tid / TJ) * MR, c0 = (tid % TJ)
    * NR.  `expr` / `offset` / `shape`: the emitter's C text of an expression / of a load's flat element index,
    a buffer's shape."""
    t = g.threads
    ap = g.bm + 4

    def spec(which: str):
        if which == "a":
            return g.a, g.a_fast, g.a_vec, g.bm, "hl_p", "hl_As", "hl_ra"
        return g.b, g.b_fast, g.b_vec, g.bn, "hl_c", "hl_Bs", "hl_rb"

    def count(which: str) -> tuple[int, int]:
        _, _, vec, o, *_ = spec(which)
        n = g.bk * o // (4 if vec else 1)
        return n, -(-n // t)

    def pos(which: str) -> str:
        _, fast, vec, o, ov, *_ = spec(which)
        w = 4 if vec else 1
        if fast == "q":
            return f"const int {ov} = hl_e / {g.bk // w}, hl_q = (hl_e % {g.bk // w}) * {w};"
        return f"const int hl_q = hl_e / {o // w}, {ov} = (hl_e % {o // w}) * {w};"

    def value(which: str) -> str:
        e, _, vec, *_ = spec(which)
        if not vec:
            return expr(e)
        cond, ld, other = _vector_operand(e)
        ranges = {"hl_kx": g.kt, "hl_q": g.bk, ("hl_p" if which == "a" else "hl_c"): g.bm if which == "a" else g.bn}
        aff = _affine_offset(ld, shape(ld.buffer), ranges)
        v = f"__ldg((const float4*)({sanitize(ld.buffer)} + {offset(ld) if aff is None else expr(aff)}))"
        if cond is None:
            return v
        o = expr(other)
        return f"({expr(cond)} ? {v} : make_float4({o}, {o}, {o}, {o}))"

    def load(kexpr: str) -> list[str]:
        out = [f"    {{ const int hl_kx = {kexpr};"]
        for which in "ab":
            n, slots = count(which)
            reg = spec(which)[6]
            for q in range(slots):
                guard = f"if (hl_e < {n}) " if (q + 1) * t > n else ""
                out.append(f"      {{ const int hl_e = hl_tid + {q * t}; {guard}{{ {pos(which)} "
                           f"{reg}[{q}] = {value(which)}; }} }}")
        return out + ["    }"]

    def store(buf: str) -> list[str]:
        out = []
        for which in "ab":
            _, fast, vec, o, ov, sh, reg = spec(which)
            n, slots = count(which)
            for q in range(slots):
                guard = f"if (hl_e < {n}) " if (q + 1) * t > n else ""
                if not vec:
                    st = f"{sh}[{buf}][hl_q][{ov}] = {reg}[{q}];"
                elif fast == "o":
                    st = f"*(float4*)&{sh}[{buf}][hl_q][{ov}] = {reg}[{q}];"
                else:
                    st = " ".join(f"{sh}[{buf}][hl_q + {k}][{ov}] = {reg}[{q}].{'xyzw'[k]};" for k in range(4))
                out.append(f"    {{ const int hl_e = hl_tid + {q * t}; {guard}{{ {pos(which)} {st} }} }}")
        return out

    frag = _fragment

    na, la = count("a")
    nb, lb = count("b")
    ta = "float4" if g.a_vec else "float"
    tb = "float4" if g.b_vec else "float"
    return [f"{{  // implicit-GEMM template: {g.bm}x{g.bn}x{g.bk} tile, {g.mr}x{g.nr} per thread, double-buffered",
            f"  __shared__ __align__(16) float hl_As[2][{g.bk}][{ap}];",
            f"  __shared__ __align__(16) float hl_Bs[2][{g.bk}][{g.bn}];",
            "  const int hl_tid = threadIdx.x;",
            f"  const int hl_r0 = (hl_tid / {g.tj}) * {g.mr}, hl_c0 = (hl_tid % {g.tj}) * {g.nr};",
            f"  {ta} hl_ra[{la}];",
            f"  {tb} hl_rb[{lb}];",
            *load("0"), *store("0"), "  __syncthreads();",
            *_double_buffered_k_loop(g.kt, g.bk, g.mr, g.nr, acc, load("hl_kt + 1"), store("hl_cur ^ 1"),
                                     frag("hl_b", "hl_Bs[hl_cur][hl_kk]", g.nr, "hl_c0")),
            "}"]


# ----------------------------------------------------------------------------- the module

def _index_type(func: LoopFunc, temps: list[Allocate]) -> str:
    sizes = [math.prod(b.shape) for b in func.params] + [math.prod(a.shape) for a in temps]
    sizes += [math.prod(a.shape) for a in walk_stmts(func.body) if isinstance(a, Allocate)]
    sizes += [int(f.const_extent or 2 ** 40) for f in walk_stmts(func.body) if isinstance(f, For)]
    return "int" if max(sizes, default=0) < 2 ** 30 else "long long"


#: the target arch of the code being generated (`generate_cuda`'s `arch`); the wgmma template only for WGMMA_ARCHS
_ARCH: contextvars.ContextVar[str] = contextvars.ContextVar("hlotune_cuda_arch", default="sm_90")
WGMMA_ARCHS = frozenset({"sm_90", "sm_90a"})


def generate_cuda(func: LoopFunc, arch: str | None = None) -> CudaSource:
    """The CUDA C source of `func` for `arch` (default sm_90, the H200): one `__global__` kernel per root nest,
    launched in order.  Only sm_90 gets the wgmma template (other archs keep mma.sync or FFMA for those tilings)."""
    token = _ARCH.set(arch or "sm_90")
    try:
        return _generate_cuda(func)
    finally:
        _ARCH.reset(token)


def _generate_cuda(func: LoopFunc) -> CudaSource:
    temps: list[Allocate] = []
    kernels = _split_kernels(func.body, temps)
    idx = _index_type(func, temps)
    base = sanitize(func.name)
    head = ["// generated by hlotune (codegen.cuda)"]
    head.append("#include <cuda_fp16.h>")
    head.append(f"typedef {idx} hl_idx;")
    head.append(_prelude())
    params = {b.name: b for b in func.params}
    params.update({a.buffer: BufferDecl(a.buffer, a.shape, a.dtype, "global") for a in temps})
    inputs = {b.name for b in func.inputs}
    launches = []
    body_text = []
    tset = frozenset(a.buffer for a in temps)
    if MERGE_SMALL_KERNELS and len(kernels) > 1:
        kernels = _merge_small(kernels, lambda kern: _kernel("hl_probe", kern, params, inputs, idx, tset))
    for k, kern in enumerate(kernels):
        name = f"{base}_k{k}" if len(kernels) > 1 else base
        text, launch = _kernel(name, kern, params, inputs, idx, tset)
        body_text.append(text)
        launches.append(launch)
    if any("hl_cp_commit();" in t for t in body_text):
        head.append(CP_ASYNC_PRELUDE)
    if any("hl_mma_tf32(" in t or "hl_split_tf32(" in t for t in body_text):
        head.append(MMA_PRELUDE)
    wg_ns = sorted({int(x) for t in body_text for x in re.findall(r"hl_wgmma_n(\d+)\(", t)})
    if wg_ns:
        head.append(wgmma_prelude(wg_ns))
    if any("hl_fdiv_row(" in t or "hl_fdiv_fast(" in t for t in body_text):
        head.append(ROW_DIV_PRELUDE)
    temp_decls = tuple(BufferDecl(a.buffer, a.shape, a.dtype, "global") for a in temps)
    return CudaSource(func, "\n".join(head + body_text) + "\n", tuple(launches), temp_decls, 32 if idx == "int" else 64)


#: consecutive small kernels of one function (one block, or at most SMALL_GRID blocks of at most SMALL_WORK stores in
#: all, whose block loops then run serially) become one kernel, a __syncthreads between them (`_merge_small`): a
#: launch costs about a microsecond even in a CUDA graph, more than such a kernel's work (mlp_train_step: 23 kernels,
#: most of one block; 15 joined, 6 us less on the H200)
MERGE_SMALL_KERNELS = True
SMALL_GRID = 8
SMALL_WORK = 1 << 14


def _work(s: Stmt) -> float:
    """Stores executed by `s` (every loop counted, bound or not); inf when an extent is not constant."""
    if isinstance(s, Store):
        return 1
    if isinstance(s, For):
        n = s.const_extent
        return math.inf if n is None else n * _work(s.body)
    return sum(_work(c) for c in _children(s))


def _one_block(kern: Stmt) -> Stmt | None:
    """`kern` as a one-block kernel: as it is when it binds no block loop of extent above 1; its block loops made
    serial when they are at most SMALL_GRID blocks and it is at most SMALL_WORK stores; else None."""
    blocks = [f for f in walk_stmts(kern) if isinstance(f, For) and f.kind in _BLOCK]
    if all(f.const_extent == 1 for f in blocks):
        return kern
    if math.prod(f.const_extent or math.inf for f in blocks) > SMALL_GRID or _work(kern) > SMALL_WORK:
        return None
    return _map_for(kern, lambda f: For(f.var, f.min, f.extent, ForKind.SERIAL, f.body, f.annotations)
                    if f.kind in _BLOCK else f)


def _map_for(s: Stmt, fn) -> Stmt:
    if isinstance(s, For):
        return fn(For(s.var, s.min, s.extent, s.kind, _map_for(s.body, fn), s.annotations))
    if isinstance(s, Seq):
        return Seq(tuple(_map_for(c, fn) for c in s.body))
    if isinstance(s, If):
        return If(s.cond, _map_for(s.then, fn), None if s.otherwise is None else _map_for(s.otherwise, fn))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, s.dtype, s.shape, s.scope, _map_for(s.body, fn))
    return s


def _merge_small(kernels: list[Stmt], compile_) -> list[Stmt]:
    """Runs of consecutive one-block kernels (`_one_block`) joined into one kernel, a Barrier between them (their
    global intermediates are written and read by the block's threads).  A join is kept when the joined kernel
    compiles (`compile_`: CompileError otherwise) to one block of one dimension (a named per-row barrier or a
    2-D block would not order the whole block); else the run ends there."""
    out: list[Stmt] = []
    run: list[tuple[Stmt, Stmt]] = []     # the current run: (kernel as given, its one-block form)

    def joined(items: list[tuple[Stmt, Stmt]]) -> Stmt:
        return Seq(tuple(x for i, (_, k) in enumerate(items) for x in ((Barrier(), k) if i else (k,))))

    def flush() -> None:
        if run:
            out.append(run[0][0] if len(run) == 1 else joined(run))
            run.clear()

    for kern in kernels:
        one = _one_block(kern)
        if one is None:
            flush()
            out.append(kern)
            continue
        if run and not _one_dim_block(joined(run + [(kern, one)]), compile_):
            flush()
        run.append((kern, one))
    flush()
    return out


def _one_dim_block(kern: Stmt, compile_) -> bool:
    try:
        _, launch = compile_(kern)
    except CompileError:
        return False
    return launch.grid == (1, 1, 1) and launch.block[1:] == (1, 1)


def _stmt_exprs(s: Stmt):
    if isinstance(s, Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, If):
        yield s.cond


def _sync(kern: Stmt, plan: _KernelPlan, name: str) -> Stmt:
    try:
        out, _, _ = _insert_sync(kern, plan, frozenset(), frozenset())
    except CompileError as e:
        raise CompileError(f"kernel {name}: {e.message}") from None
    return out


def _kernel(name: str, kern: Stmt, params: dict[str, BufferDecl], inputs: set[str], idx: str,
            temps: frozenset[str] = frozenset()) -> tuple[str, Launch]:
    scal: dict = {n: params[n] for n in temps}
    scal.update({a.buffer: a for a in walk_stmts(kern) if isinstance(a, Allocate)})
    kern = _scalarize(kern, scal)
    plan = _plan(kern, name)
    _grid_stride(kern, plan)
    kern = _sync(kern, plan, name)
    _check_barriers(kern, plan, name)
    gemms = _gemm_loops(kern, params, plan)
    r, w = _accesses(kern)
    allocated = {a.buffer for a in walk_stmts(kern) if isinstance(a, Allocate)}
    used = [n for n in params if n in (r | w) and n not in allocated]
    for n in w - allocated:
        if n in inputs:
            raise CompileError(f"kernel {name} writes its input {n!r}")
    em = _Emitter(name, {n: params[n] for n in used}, plan, "hl_idx", idx)
    em.gemms = gemms
    threads = plan.block[0] * plan.block[1] * plan.block[2]
    sig = []
    for n in used:
        d = params[n]
        const = "const " if n in inputs else ""
        sig.append(f"{const}{ctype(d.dtype)}* __restrict__ {sanitize(n)}")
    # shared buffers at kernel scope
    decls = []
    off = 0
    total = sum(_align16(max(1, math.prod(a.shape)) * plan.copies(a.buffer) * _BYTES[a.dtype])
                for a in plan.shared.values())
    total += sum(g.shared_bytes for g in gemms.values())
    dynamic = total > STATIC_SHARED_LIMIT
    if dynamic:
        decls.append("extern __shared__ __align__(16) unsigned char hl_smem[];")
    for a in plan.shared.values():
        n = max(1, math.prod(a.shape)) * plan.copies(a.buffer)
        if dynamic:
            decls.append(f"{ctype(a.dtype)}* {sanitize(a.buffer)} = ({ctype(a.dtype)}*)(hl_smem + {off});")
            off += _align16(n * _BYTES[a.dtype])
        else:
            decls.append(f"__shared__ __align__(16) {ctype(a.dtype)} {sanitize(a.buffer)}[{n}];")
    if dynamic:     # the mma templates' tiles after the kernel's own shared buffers (`_gemm_loops` allows no others)
        for k_, g_ in gemms.items():
            if isinstance(g_, _Gemm) and (g_.mma or g_.simt):
                gemms[k_] = dataclasses.replace(g_, smem_off=off)
                off += _align16(g_.shared_bytes)
    bounds = f"{threads}, 2" if gemms and threads <= 256 else f"{threads}"   # GEMM: at most 128 registers
    if any(isinstance(g, _Gemm) and g.mma and _mma_big_regs(g) for g in gemms.values()):
        bounds = f"{threads}, 1"    # 255 registers: 256-thread mma blocks of big register tiles
    if any(isinstance(g, _Gemm) and g.simt for g in gemms.values()):
        bounds = f"{threads}, 1"    # cuda_simt: 217-235 registers
    em.raster = _kernel_raster(kern, plan, gemms)
    if em.raster is not None:
        gemms.update({k_: dataclasses.replace(g_, raster=True) for k_, g_ in gemms.items()})
    lines = [f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({", ".join(sig)}) {{']
    lines += ["  " + x for x in decls]
    em.stmt(kern, 1, frozenset(), frozenset())
    lines += em.lines
    lines.append("}")
    launch = Launch(name, tuple(plan.grid), tuple(plan.block), total, total if dynamic else 0, tuple(used))
    return "\n".join(lines) + "\n", launch


#: grid-stride kernels: a kernel whose only blockIdx loop is one blockIdx.x loop of more than this many
#: iterations, with no shared memory and no barrier, runs on this many blocks, each looping over its share of
#: the iterations (0: off; measured on the H200 with 4-16 resident blocks per SM: 0.5-10 us slower than one block
#: per tile for every memory-bound kernel).  Part of the generated text, so of the cache key.
GRID_STRIDE_BLOCKS = 0


def _grid_stride(kern: Stmt, plan: _KernelPlan) -> None:
    g = GRID_STRIDE_BLOCKS
    if not g or plan.grid[1:] != [1, 1] or plan.grid[0] <= g or plan.shared:
        return
    loops = [f for f in walk_stmts(kern) if isinstance(f, For) and f.kind in _BLOCK]
    if len(loops) != 1 or any(isinstance(b, Barrier) for b in walk_stmts(kern)):
        return
    plan.stride_x = plan.grid[0]
    plan.grid[0] = g


def _top_serial_loops(s: Stmt, plan: _KernelPlan, bids: tuple[str, ...] = (), tids: tuple[str, ...] = ()):
    """(loop, blockIdx.x vars, threadIdx.x vars) for every serial loop reached from the kernel's root through
    full-extent blockIdx.x / threadIdx.x loops, Seq and Allocate only (uniform points: no If, no guard)."""
    if isinstance(s, For):
        if s.kind is ForKind.BLOCK_X and s.const_extent == plan.grid[0]:
            yield from _top_serial_loops(s.body, plan, (*bids, s.var.name), tids)
        elif s.kind is ForKind.THREAD_X and s.const_extent == plan.block[0]:
            yield from _top_serial_loops(s.body, plan, bids, (*tids, s.var.name))
        elif s.kind is ForKind.SERIAL:
            yield s, bids, tids
    elif isinstance(s, Seq | Allocate):
        for c in _children(s):
            yield from _top_serial_loops(c, plan, bids, tids)


def _gemm_loops(kern: Stmt, params: dict[str, BufferDecl], plan: _KernelPlan) -> dict[str, _Gemm | _IGemm]:
    """Loop var -> GEMM template parameters of the K-tile loops of `kern` that match the template (or else the
    implicit-GEMM template); their shared tiles leave `plan.shared` (the template declares its own,
    double-buffered)."""
    decls = dict(params)
    for a in walk_stmts(kern):
        if isinstance(a, Allocate):
            decls[a.buffer] = BufferDecl(a.buffer, a.shape, a.dtype, "shared" if a.buffer in plan.shared else "local")
    out: dict[str, _Gemm | _IGemm] = {}
    hw = {f.var.name: ("bid" if f.kind is ForKind.BLOCK_X else "tid") for f in walk_stmts(kern)
          if isinstance(f, For) and f.kind in (ForKind.BLOCK_X, ForKind.THREAD_X)}
    for f in walk_stmts(kern):
        if isinstance(f, For) and f.kind is ForKind.SERIAL:
            g = _gemm_info(f, decls, plan, hw)
            if g is not None:
                out[f.var.name] = g
    if not out and not plan.shared:
        written = _accesses(kern)[1]
        for f, bids, tids in _top_serial_loops(kern, plan):
            ig = _igemm_info(f, decls, plan, list(bids), tids[0], written) if len(tids) == 1 else None
            if ig is not None:
                out[f.var.name] = ig
    if out:
        inner = {a.buffer for f in walk_stmts(kern) if isinstance(f, For) and f.var.name in out
                 for a in walk_stmts(f.body) if isinstance(a, Allocate)}
        rest = sum(_align16(max(1, math.prod(a.shape)) * _BYTES[a.dtype]) for n, a in plan.shared.items()
                   if n not in inner)
        limit = GEMM_MMA_SHARED_LIMIT if all(isinstance(g, _Gemm) and g.mma for g in out.values()) else \
            STATIC_SHARED_LIMIT
        if all(isinstance(g, _Gemm) and (g.mma or g.simt) for g in out.values()) and \
                any(isinstance(g, _Gemm) and g.simt for g in out.values()):
            limit = max(GEMM_MMA_SHARED_LIMIT, GEMM_SIMT_SHARED_LIMIT)
        if any(isinstance(g, _Gemm) and g.wgmma for g in out.values()):
            limit = GEMM_WGMMA_SHARED_LIMIT
        if rest + sum(g.shared_bytes for g in out.values()) > max(min(limit, _shared_cap()), STATIC_SHARED_LIMIT):
            return {}
        for n in inner:
            plan.shared.pop(n, None)
    return out


def _kernel_raster(kern: Stmt, plan: _KernelPlan, gemms: dict) -> str | None:
    """The block index expression of a kernel whose one GEMM loop runs the `cuda_simt` template with grouped
    rasterization: every use of the kernel's (single, full-extent) blockIdx.x loop variable then reads the same tile
    as the template (None: blockIdx.x)."""
    simts = [g for g in gemms.values() if isinstance(g, _Gemm) and g.simt]
    if len(simts) != 1 or len(gemms) != 1 or plan.stride_x:
        return None
    blocks = [f for f in walk_stmts(kern) if isinstance(f, For) and f.kind in _BLOCK]
    if len(blocks) != 1 or blocks[0].kind is not ForKind.BLOCK_X or blocks[0].const_extent != plan.grid[0]:
        return None
    return simt_raster(simts[0], GEMM_SIMT_GROUP)


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


__all__ = ["generate_cuda", "CudaSource", "Launch", "ctype", "const_text", "PRELUDE", "igemm_loop_nest",
           "mma_index_exprs"]
