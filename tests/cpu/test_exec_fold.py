"""fusion.fold_dot_transposes: transpose(dot(a, b)) -> dot(b, a) before clustering.  The rewritten program
equals the original (reference interpreter) and compiled models still match; folds only where the
permutation is the swap, the dot has no other reader and the new minor dim is not short."""

import numpy as np
import pytest

import hlotune
from hlotune import config
from hlotune.ir.fusion import fold_dot_transposes, fuse
from hlotune.ir.hlo import Op
from hlotune.ir.interp import evaluate
from hlotune.ir.parser import parse_hlo
from tests.conftest import model_io, model_path


def _module(body: str, params: str) -> object:
    return parse_hlo(f"HloModule t\n\nENTRY main {{\n{params}\n{body}\n}}\n")


def _args(m, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.array_shape.dims).astype(np.float32) for p in m.entry_computation.parameters]


def _ops(comp):
    return [i.op for i in comp]


GRAD = ("  dy = f32[64,32]{1,0} parameter(0)\n  x = f32[64,48]{1,0} parameter(1)\n"
        "  w = f32[48,32]{1,0} parameter(2)")
GRAD_BODY = ("  g = f32[32,48]{1,0} dot(dy, x), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
             "  gt = f32[48,32]{0,1} transpose(g), dimensions={1,0}\n"
             "  lr = f32[] constant(0.1)\n  lrb = f32[48,32]{1,0} broadcast(lr), dimensions={}\n"
             "  s = f32[48,32]{1,0} multiply(gt, lrb)\n  ROOT u = f32[48,32]{1,0} subtract(w, s)")


def test_weight_gradient_fold_and_output_fusion():
    m = _module(GRAD_BODY, GRAD)
    folded = fold_dot_transposes(m.entry_computation)
    assert Op.TRANSPOSE not in _ops(folded)
    (dot,) = [i for i in folded if i.op is Op.DOT]
    assert dot.name == "gt" and dot.operands == ("x", "dy") and dot.array_shape.dims == (48, 32)
    assert dot.attr("lhs_contracting_dims") == (0,) and dot.attr("rhs_contracting_dims") == (0,)
    p = fuse(m)
    assert len(p.subgraphs) == 1 and p.subgraphs[0].kind == "output"   # the update joins the dot
    args = _args(m)
    np.testing.assert_allclose(evaluate(p.module, args)[0], evaluate(m, args)[0], rtol=1e-5, atol=1e-5)
    got = hlotune.compile(hlotune.load_model(m))(*args)[0]
    np.testing.assert_allclose(got, evaluate(m, args)[0], rtol=1e-5, atol=1e-5)


def test_batched_dot_fold_keeps_batch_dims():
    params = "  a = f32[4,16,8]{2,1,0} parameter(0)\n  b = f32[4,8,32]{2,1,0} parameter(1)"
    body = ("  d = f32[4,16,32]{2,1,0} dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
            "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
            "  ROOT t = f32[4,32,16]{2,1,0} transpose(d), dimensions={0,2,1}")
    m = _module(body, params)
    folded = fold_dot_transposes(m.entry_computation)
    (dot,) = [i for i in folded if i.op is Op.DOT]
    assert dot.operands == ("b", "a") and dot.attr("lhs_batch_dims") == (0,)
    assert dot.attr("lhs_contracting_dims") == (1,) and dot.attr("rhs_contracting_dims") == (2,)
    args = _args(m)
    got = hlotune.compile(hlotune.load_model(m))(*args)[0]
    np.testing.assert_allclose(got, evaluate(m, args)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("body", [
    # the dot has another reader
    "  d = f32[32,48]{1,0} dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
    "  t = f32[48,32]{1,0} transpose(d), dimensions={1,0}\n  n = f32[32,48]{1,0} negate(d)\n"
    "  ROOT r = (f32[48,32]{1,0}, f32[32,48]{1,0}) tuple(t, n)",
    # the new minor dim (10) would be shorter than a vector while the old one (48) is not
    "  d = f32[10,48]{1,0} dot(c, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n"
    "  ROOT t = f32[48,10]{1,0} transpose(d), dimensions={1,0}",
])
def test_not_folded(body):
    params = ("  a = f32[64,32]{1,0} parameter(0)\n  b = f32[64,48]{1,0} parameter(1)\n"
              "  c = f32[64,10]{1,0} parameter(2)")
    m = _module(body, params)
    assert Op.TRANSPOSE in _ops(fold_dot_transposes(m.entry_computation))
    args = _args(m)
    for g, w in zip(hlotune.compile(hlotune.load_model(m))(*args), evaluate(m, args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_batch_permutation_is_not_a_swap():
    params = "  a = f32[4,16,8]{2,1,0} parameter(0)\n  b = f32[4,8,32]{2,1,0} parameter(1)"
    body = ("  d = f32[4,16,32]{2,1,0} dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, "
            "rhs_batch_dims={0}, rhs_contracting_dims={1}\n"
            "  ROOT t = f32[16,4,32]{2,1,0} transpose(d), dimensions={1,0,2}")
    m = _module(body, params)
    assert Op.TRANSPOSE in _ops(fold_dot_transposes(m.entry_computation))


def test_mlp_train_step_weight_update_is_one_subgraph():
    """The dW1 dot, its transpose and the SGD update of w1 are one output fusion; results match JAX."""
    m = hlotune.load_model(str(model_path("mlp_train_step")))
    names = {s.name: s for s in m.frontend.subgraphs}
    upd = [s for s in m.frontend.subgraphs if Op.DOT in {i.op for i in s.computation}
           and Op.SUBTRACT in {i.op for i in s.computation} and Op.TRANSPOSE not in {i.op for i in s.computation}]
    assert upd, sorted(names)
    args, outs = model_io("mlp_train_step")
    for g, w in zip(hlotune.compile(m)(*args), outs):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_setting_off_keeps_the_transpose():
    saved = config.get("fold_dot_transpose")
    config.replace_default("fold_dot_transpose", False)
    try:
        p = fuse(_module(GRAD_BODY, GRAD))
    finally:
        config.replace_default("fold_dot_transpose", saved)
    assert any(Op.TRANSPOSE in {i.op for i in s.computation} for s in p.subgraphs)
