"""Workload keys, weights, FLOPs / bytes and the JSON form of compute definitions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hlotune.ir.compute import compute_definition
from hlotune.ir.fusion import fuse
from hlotune.ir.hlo import Op
from hlotune.ir.parser import parse_hlo
from hlotune.ir.passes import optimize
from hlotune.ir.workload import (
    bytes_moved,
    canonical,
    extract_workloads,
    flops,
    workload_from_json,
    workload_key,
    workload_to_json,
)

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
NAMES = sorted(p.name for p in MODELS.iterdir() if p.is_dir())
MANIFEST = json.loads((MODELS / "manifest.json").read_text())["models"]


def program(name: str, suffix: str = ".hlo"):
    return fuse(optimize(parse_hlo((MODELS / name / f"{name}{suffix}").read_text())))


def all_defs(name: str, suffix: str):
    if suffix.endswith("opt.hlo"):
        m = parse_hlo((MODELS / name / f"{name}{suffix}").read_text())
        called = {i.attr("calls") for c in m.computations for i in c if i.op is Op.FUSION}
        return [compute_definition(c, m) for c in m.computations if c.name in called]
    prog = program(name, suffix)
    return [compute_definition(sg.computation, prog.module) for sg in prog.subgraphs]


def rename_all(text: str) -> str:
    """Every instruction, parameter and computation name changed (with and without %)."""
    names = set(re.findall(r"%([\w.\-]+)", text))
    names |= set(re.findall(r"^\s*(?:ROOT\s+)?([\w.\-]+)\s*=", text, re.M))
    names |= set(re.findall(r"[(,]\s*([\w.\-]+):", text))
    names -= {op.value for op in Op} | {"ROOT", "ENTRY"}  # an instruction named like an opcode keeps its name
    for n in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.\-]){re.escape(n)}(?![\w.\-])", f"zz{len(n)}_{n[::-1]}", text)
    return text


@pytest.mark.parametrize("name", NAMES)
def test_json_round_trip(name):
    for suffix in (".hlo", ".opt.hlo", ".bench.gpu.opt.hlo"):
        for cd in all_defs(name, suffix):
            text = workload_to_json(cd)
            back = workload_from_json(text)
            assert back == cd
            assert workload_to_json(back) == text
            assert workload_key(back) == workload_key(cd)


@pytest.mark.parametrize("name", ["transformer_block", "mlp_train_step", "layernorm", "conv2d_bias_relu"])
def test_key_ignores_names(name):
    for suffix in (".hlo", ".opt.hlo"):
        text = (MODELS / name / f"{name}{suffix}").read_text()
        renamed = rename_all(text)
        assert renamed != text
        m1, m2 = parse_hlo(text), parse_hlo(renamed)
        if suffix == ".hlo":
            p1, p2 = fuse(optimize(m1)), fuse(optimize(m2))
            d1 = [compute_definition(s.computation, p1.module) for s in p1.subgraphs]
            d2 = [compute_definition(s.computation, p2.module) for s in p2.subgraphs]
        else:
            d1, d2 = all_defs(name, suffix), []
            called = {i.attr("calls") for c in m2.computations for i in c if i.op is Op.FUSION}
            d2 = [compute_definition(c, m2) for c in m2.computations if c.name in called]
        assert len(d1) == len(d2) > 0
        assert any(str(a) != str(b) for a, b in zip(d1, d2))  # the names did change
        for a, b in zip(d1, d2):
            assert workload_key(a) == workload_key(b)
            assert canonical(a) == canonical(b)


BASE = """
  p0 = f32[4,6] parameter(0)
  p1 = f32[6] parameter(1)
  b = f32[4,6] broadcast(p1), dimensions={1}
  a = f32[4,6] add(p0, b)
  c = f32[] constant(0)
  ROOT r = f32[4] reduce(a, c), dimensions={1}, to_apply=add_c"""
ADD = "add_c {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT z = f32[] add(x, y)\n}\n"


def key_of(body: str, extra: str = ADD) -> str:
    m = parse_hlo(f"HloModule t\n\n{extra}\nENTRY e {{\n{body}\n}}\n")
    return workload_key(compute_definition(m.entry_computation, m))


def test_key_changes_with_structure():
    k = key_of(BASE)
    assert k.startswith("w1-") and len(k) == 3 + 20
    assert key_of(BASE.replace("p0 = f32[4,6]", "q = f32[4,6]").replace("add(p0", "add(q")) == k
    variants = [
        BASE.replace("[4,6]", "[5,6]").replace("f32[4]", "f32[5]"),                  # a shape
        BASE.replace("f32", "f64"),                                                  # a dtype
        BASE.replace("add(p0, b)", "multiply(p0, b)"),                               # an op
        BASE.replace("constant(0)", "constant(1)"),                                  # a constant
        BASE.replace("dimensions={1}, to", "dimensions={0}, to").replace("f32[4] reduce", "f32[6] reduce"),
    ]
    keys = [key_of(v, ADD.replace("f32", "f64") if "f64" in v else ADD) for v in variants]
    assert len(set(keys + [k])) == len(keys) + 1


def test_transformer_block_weights():
    ws = extract_workloads(program("transformer_block"))
    weights = {w.key: w.weight for _, w in ws}
    assert max(weights.values()) == 3  # the q/k/v projections are one workload
    assert sum(weights.values()) >= len(weights)
    by_key = {}
    for _, w in ws:
        by_key.setdefault(w.key, []).append(w)
    for group in by_key.values():
        assert len(group) == group[0].weight and all(g is group[0] for g in group)


@pytest.mark.parametrize("name", ["matmul", "dense_bias_relu", "batch_matmul", "conv2d_bias_relu", "gelu_tanh",
                                  "sin_mul_add", "relu_chain", "sum_reduce", "row_sum", "mlp2"])
def test_flops_match_manifest(name):
    """Bench-size subgraph FLOPs summed over the program equal the manifest's count."""
    ws = extract_workloads(program(name, ".bench.hlo"))
    assert sum(w.flops for _, w in ws) == pytest.approx(MANIFEST[name]["bench"]["flops"], rel=1e-3)


def test_matmul_numbers():
    (sg, w), = extract_workloads(program("matmul"))
    m, k, n = 64, 48, 32
    assert w.flops == 2 * m * n * k
    assert w.bytes == bytes_moved(w.compute) == 4 * (m * k + k * n + m * n)
    assert w.shapes == (("f32[64,48]", "f32[48,32]"), ("f32[64,32]",))
    assert "dot" in w.opcodes
    assert flops(w.compute) == w.flops


def test_workload_json_is_self_describing():
    m = parse_hlo("HloModule t\n\ngen {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                  "  c = f32[] abs(b)\n  ROOT r = f32[] maximum(a, c)\n}\n\nENTRY e {\n"
                  "  p0 = f32[3,4] parameter(0)\n"
                  "  k = f32[3,4] constant({ {1, 2, 3, 4}, {5, 6, 7, 8}, {0, 0, 0, nan} })\n"
                  "  s = f32[3,4] multiply(p0, k)\n  i = f32[] constant(-inf)\n"
                  "  ROOT r = f32[3] reduce(s, i), dimensions={1}, to_apply=gen\n}\n")
    cd = compute_definition(m.entry_computation, m)
    assert cd.constants and cd.stages[-1].reducer.combiner is not None
    text = workload_to_json(cd)
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    assert workload_from_json(text) == cd
