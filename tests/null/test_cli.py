"""The `hlotune` command: contracts of DESIGN.md (exit codes, one-line errors, npz layout)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hlotune.cli import main
from tests.conftest import MODELS_DIR, model_io, model_path

ENV = {k: v for k, v in os.environ.items() if k != "HLOTUNE_DEBUG"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hlotune.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


@pytest.mark.parametrize("name", ["softmax", "dense_bias_relu"])
def test_run_reference_matches_jax(tmp_path, name):
    args, outs = model_io(name)
    out = tmp_path / "out.npz"
    rc = main(["run", str(model_path(name)), "--inputs", str(MODELS_DIR / name / f"{name}.npz"),
               "--out", str(out), "--reference"])
    assert rc == 0
    got = np.load(out)
    assert sorted(got.files) == [f"out{i}" for i in range(len(outs))]
    for i, want in enumerate(outs):
        np.testing.assert_allclose(got[f"out{i}"], want, rtol=1e-5, atol=1e-6)


def test_inspect_json_lists_subgraphs(capsys):
    assert main(["inspect", str(model_path("dense_bias_relu")), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["subgraphs"], report
    for s in report["subgraphs"]:
        assert s["key"].startswith("w")
        assert s["weight"] >= 1 and s["flops"] > 0 and s["bytes"] > 0
        assert "dot" in s["opcodes"] or "maximum" in s["opcodes"] or s["opcodes"]
    total = sum(s["flops"] * s["weight"] for s in report["subgraphs"])
    # dot 16x64x32: 2*16*64*32 flops, plus bias add and relu per output element
    assert total >= 2 * 16 * 64 * 32


@pytest.mark.parametrize("argv,needle", [
    (["inspect", "/nonexistent/model.hlo"], "not found"),
    (["run", "/nonexistent/model.hlo", "--inputs", "x.npz", "--out", "y.npz"], "not found"),
])
def test_user_errors_are_one_line_exit_2(argv, needle):
    p = run_cli(*argv)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert needle in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_malformed_hlo_names_line(tmp_path):
    text = model_path("softmax").read_text().splitlines()
    # corrupt one instruction line in the middle of the entry computation
    idx = next(i for i, ln in enumerate(text) if "exponential(" in ln)
    text[idx] = text[idx].replace("exponential(", "exponentiol(")
    bad = tmp_path / "bad.hlo"
    bad.write_text("\n".join(text))
    p = run_cli("inspect", str(bad))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "exponentiol" in p.stderr and f"line {idx + 1}" in p.stderr and "bad.hlo" in p.stderr


def test_wrong_inputs_file_is_user_error(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros(3))
    p = run_cli("run", str(model_path("softmax")), "--inputs", str(tmp_path / "in.npz"),
                "--out", str(tmp_path / "o.npz"), "--reference")
    assert p.returncode == 2 and "arg0" in p.stderr and "Traceback" not in p.stderr


def test_wrong_input_shape_names_argument(tmp_path):
    np.savez(tmp_path / "in.npz", arg0=np.zeros((3, 3), np.float32))
    p = run_cli("run", str(model_path("softmax")), "--inputs", str(tmp_path / "in.npz"),
                "--out", str(tmp_path / "o.npz"), "--reference")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "shape" in p.stderr


@pytest.mark.parametrize("sub", ["inspect", "run", "config", "db"])
def test_help(sub):
    p = run_cli(sub, "--help")
    assert p.returncode == 0 and "usage" in p.stdout
