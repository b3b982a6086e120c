"""What a library custom-call (cuBLAS gemm, cuDNN convolution) computes, read from its attributes.

Map:
  GemmSpec              a cuBLAS gemm: dot dimension numbers, alpha, beta, epilogue, operand roles
  ConvSpec              a cuDNN convolution: window, dim_labels, groups, activation, scales, operand roles
  CustomCallSpec        GemmSpec | ConvSpec
  describe_custom_call  Instruction -> CustomCallSpec (UnsupportedError on anything else)

The interpreter evaluates these specs; a legalization pass rewrites them into plain HLO
(dot / convolution + elementwise epilogue).  Semantics:

  gemm:  out = epilogue(alpha * dot(a, b) + beta * c + bias)
         operands: a, b, then c when beta != 0, then the bias vector when the epilogue has BIAS
         (broadcast along the last output dimension).
  conv:  out = activation(conv_result_scale * conv(x, w) + side_input_scale * side + bias)
         operands: x, w, then bias (convBiasActivationForward), then the side input when present.

Both return a tuple (result, u8/s8 workspace); the workspace carries no data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedError
from .hlo import CUBLAS_TARGETS, CUDNN_CONV_TARGETS, ArrayShape, ConvDims, Instruction, TupleShape, Window

#: cuBLAS epilogues: name -> (adds a bias vector, activation applied after)
GEMM_EPILOGUES = {
    "DEFAULT": (False, None),
    "BIAS": (True, None),
    "RELU": (False, "relu"),
    "BIAS_RELU": (True, "relu"),
    "GELU": (False, "gelu"),
    "BIAS_GELU": (True, "gelu"),
}
#: cuDNN activation modes -> activation name (None = identity)
CONV_ACTIVATIONS = {
    "kNone": None, "kRelu": "relu", "kRelu6": "relu6", "kElu": "elu", "kLeakyRelu": "leaky_relu",
    "kSigmoid": "sigmoid", "kTanh": "tanh", "kGeluApproximate": "gelu",
}


@dataclass(frozen=True)
class GemmSpec:
    """A cuBLAS gemm custom-call read as a dot plus epilogue."""

    lhs_batch_dims: tuple[int, ...]
    lhs_contracting_dims: tuple[int, ...]
    rhs_batch_dims: tuple[int, ...]
    rhs_contracting_dims: tuple[int, ...]
    alpha: float = 1.0
    beta: float = 0.0
    has_bias: bool = False
    activation: str | None = None
    #: operand index of the matrix added with `beta` (None when beta == 0)
    c_operand: int | None = None
    #: operand index of the bias vector (None without a BIAS epilogue)
    bias_operand: int | None = None
    epilogue: str = "DEFAULT"
    precision: tuple[str, ...] = ()
    kind: str = "gemm"


@dataclass(frozen=True)
class ConvSpec:
    """A cuDNN convolution custom-call read as a convolution plus bias, side input and activation."""

    window: Window
    dim_labels: ConvDims
    feature_group_count: int = 1
    batch_group_count: int = 1
    activation: str | None = None
    conv_result_scale: float = 1.0
    side_input_scale: float = 0.0
    leakyrelu_alpha: float = 0.0
    bias_operand: int | None = None
    side_input_operand: int | None = None
    kind: str = "conv"


CustomCallSpec = GemmSpec | ConvSpec


def describe_custom_call(inst: Instruction) -> CustomCallSpec:
    """The spec of a cuBLAS gemm or cuDNN convolution custom-call; UnsupportedError otherwise."""
    target = inst.attr("custom_call_target")
    if target in CUBLAS_TARGETS:
        return _gemm(inst, _config(inst, "gemm_backend_config"))
    if target in CUDNN_CONV_TARGETS:
        return _conv(inst, target, _config(inst, "cudnn_conv_backend_config"))
    raise _err(inst, f"custom-call target {target!r} is not supported")


def _err(inst: Instruction, msg: str) -> UnsupportedError:
    return UnsupportedError(msg, line=inst.line, op=inst.name)


def _config(inst: Instruction, key: str) -> dict[str, Any]:
    raw = inst.attr("backend_config")
    if raw is None:
        raise _err(inst, f"custom-call has no backend_config (need {key})")
    text = raw.strip() if isinstance(raw, str) else raw
    if isinstance(text, str) and text.startswith('"') and text.endswith('"'):
        try:
            text = json.loads(text)  # a quoted string holding the JSON
        except json.JSONDecodeError:
            pass
    try:
        cfg = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as e:
        raise _err(inst, f"malformed backend_config JSON: {e}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get(key), dict):
        raise _err(inst, f"backend_config has no {key!r} object")
    return cfg[key]


def _ints(inst: Instruction, value: Any, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in (value or ()))
    except (TypeError, ValueError):
        raise _err(inst, f"bad {what} {value!r} in backend_config") from None


def _float(inst: Instruction, value: Any, what: str, default: float) -> float:
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _err(inst, f"bad {what} {value!r} in backend_config") from None


def _gemm(inst: Instruction, cfg: dict[str, Any]) -> GemmSpec:
    dn = cfg.get("dot_dimension_numbers")
    if not isinstance(dn, dict):
        raise _err(inst, "gemm_backend_config has no dot_dimension_numbers")
    epilogue = str(cfg.get("epilogue", "DEFAULT"))
    if epilogue not in GEMM_EPILOGUES:
        raise _err(inst, f"cuBLAS epilogue {epilogue!r} is not supported")
    if _float(inst, cfg.get("alpha_imag"), "alpha_imag", 0.0) != 0.0:
        raise _err(inst, "complex alpha is not supported")
    has_bias, act = GEMM_EPILOGUES[epilogue]
    beta = _float(inst, cfg.get("beta"), "beta", 0.0)
    nxt = 2
    c_operand = None
    if beta != 0.0:
        c_operand, nxt = nxt, nxt + 1
    bias_operand = nxt if has_bias else None
    needed = 2 + (c_operand is not None) + has_bias
    if len(inst.operands) < needed:
        raise _err(inst, f"cuBLAS gemm needs {needed} operands (beta={beta}, epilogue={epilogue}), "
                         f"has {len(inst.operands)}")
    prec = cfg.get("precision_config", {}) or {}
    return GemmSpec(
        lhs_batch_dims=_ints(inst, dn.get("lhs_batch_dimensions"), "lhs_batch_dimensions"),
        lhs_contracting_dims=_ints(inst, dn.get("lhs_contracting_dimensions"), "lhs_contracting_dimensions"),
        rhs_batch_dims=_ints(inst, dn.get("rhs_batch_dimensions"), "rhs_batch_dimensions"),
        rhs_contracting_dims=_ints(inst, dn.get("rhs_contracting_dimensions"), "rhs_contracting_dimensions"),
        alpha=_float(inst, cfg.get("alpha_real"), "alpha_real", 1.0), beta=beta, has_bias=has_bias,
        activation=act, c_operand=c_operand, bias_operand=bias_operand, epilogue=epilogue,
        precision=tuple(str(p) for p in prec.get("operand_precision", ()) if isinstance(prec, dict)),
    )


def _conv(inst: Instruction, target: str, cfg: dict[str, Any]) -> ConvSpec:
    window, labels = inst.attr("window"), inst.attr("dim_labels")
    if not isinstance(window, Window) or not isinstance(labels, ConvDims):
        raise _err(inst, "cuDNN convolution needs window and dim_labels attributes")
    mode = str(cfg.get("activation_mode", "kNone"))
    if mode not in CONV_ACTIVATIONS:
        raise _err(inst, f"cuDNN activation mode {mode!r} is not supported")
    with_bias = target == "__cudnn$convBiasActivationForward"
    side_scale = _float(inst, cfg.get("side_input_scale"), "side_input_scale", 0.0)
    bias_operand = 2 if with_bias else None
    side_operand = None
    if with_bias and len(inst.operands) > 3:
        side_operand = 3
    elif with_bias and side_scale != 0.0:
        raise _err(inst, "side_input_scale is nonzero but there is no side input operand")
    if len(inst.operands) < (3 if with_bias else 2):
        raise _err(inst, f"{target} has too few operands ({len(inst.operands)})")
    if not with_bias and mode != "kNone":
        raise _err(inst, f"{target} with activation {mode!r} is not supported")
    return ConvSpec(
        window=window, dim_labels=labels,
        feature_group_count=int(inst.attr("feature_group_count", 1)),
        batch_group_count=int(inst.attr("batch_group_count", 1)),
        activation=CONV_ACTIVATIONS[mode],
        conv_result_scale=_float(inst, cfg.get("conv_result_scale"), "conv_result_scale", 1.0),
        side_input_scale=side_scale,
        leakyrelu_alpha=_float(inst, cfg.get("leakyrelu_alpha"), "leakyrelu_alpha", 0.0),
        bias_operand=bias_operand, side_input_operand=side_operand,
    )


def result_shape(inst: Instruction) -> ArrayShape:
    """The array shape of a library custom-call's result (element 0 of its tuple)."""
    shape = inst.shape
    while isinstance(shape, TupleShape):
        shape = shape.elements[0]
    return shape
