"""`hlotune.compile` with default schedules: every fixture model, both texts, against JAX's outputs;
the extra JAX fixtures against their JAX outputs; argument errors; buffer reuse."""

import json

import numpy as np
import pytest

import hlotune
from tests.conftest import MODEL_NAMES, MODELS_DIR, model_io, model_path

EXTRA_DIR = MODELS_DIR.parent / "extra"
EXTRA = sorted(json.loads((EXTRA_DIR / "manifest.json").read_text())["models"]) if EXTRA_DIR.exists() else []


def _close(got, want, name):
    assert len(got) == len(want), name
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("kind", ["hlo", "opt.hlo"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_fixture_matches_jax(name, kind):
    args, outs = model_io(name)
    exe = hlotune.compile(str(model_path(name, kind)))
    _close(exe(*args), outs, f"{name}.{kind}")
    # every subgraph is compiled (no fixture needs the interpreter fallback)
    assert set(exe.sources().values()) == {"default"}, exe.report()


def _extra_io(name):
    data = np.load(EXTRA_DIR / name / f"{name}.npz")
    n_in = sum(k.startswith("arg") for k in data.files)
    n_out = sum(k.startswith("out") for k in data.files)
    return [data[f"arg{i}"] for i in range(n_in)], [data[f"out{i}"] for i in range(n_out)]


@pytest.mark.parametrize("name", EXTRA)
def test_extra_fixture_runs_like_the_reference(name):
    """Compiled code agrees with the HLO interpreter (exact HLO semantics) on JAX's inputs.
    (JAX's own outputs differ from exact HLO semantics for f16/bf16 chains; the front-end tests
    compare the interpreter with JAX.)"""
    path = EXTRA_DIR / name / f"{name}.hlo"
    args, _ = _extra_io(name)
    m = hlotune.load_model(str(path))
    # the npz holds bf16 inputs widened to float32, exactly as hlotune holds bf16 values
    args = [a.astype(p.shape.dtype.np) for a, p in zip(args, m.module.entry_computation.parameters)]
    want = hlotune.reference_run(m, args)
    got = hlotune.compile(m)(*args)
    # f16/bf16 sums accumulate in f32 (rounded once) where the interpreter uses f64: one ulp of the type
    text = path.read_text()
    eps = 2.0 ** -7 if "bf16[" in text else 2.0 ** -10 if "f16[" in text else 2e-5
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=eps, atol=eps * max(1.0, float(np.abs(w).max())), err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_results_are_not_overwritten_by_later_calls():
    args, outs = model_io("dense_bias_relu")
    exe = hlotune.compile(str(model_path("dense_bias_relu")))
    first = exe(*args)
    exe(*[np.zeros_like(a) for a in args])
    _close(first, outs, "first call kept")


@pytest.mark.parametrize("bad,needle", [
    (lambda a: a[:1], "takes 3 argument"),
    (lambda a: [a[0][:2]] + a[1:], "argument 0"),
    (lambda a: [a[0].astype(np.float64)] + a[1:], "dtype"),
])
def test_wrong_arguments_name_the_argument(bad, needle):
    args, _ = model_io("dense_bias_relu")
    exe = hlotune.compile(str(model_path("dense_bias_relu")))
    with pytest.raises(hlotune.InputError, match=needle):
        exe(*bad(list(args)))


def test_report_names_every_subgraph():
    exe = hlotune.compile(str(model_path("softmax")))
    rep = exe.report()
    for name in exe.sources():
        assert name in rep
