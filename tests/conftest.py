"""Shared test helpers: the bundled model fixtures (real HLO written by JAX, with JAX's outputs)."""

import json
from pathlib import Path

import numpy as np
import pytest

MODELS_DIR = Path(__file__).parent / "data" / "models"
MANIFEST = json.loads((MODELS_DIR / "manifest.json").read_text())
MODEL_NAMES = sorted(MANIFEST["models"])
TEXT_KINDS = ("hlo", "opt.hlo", "bench.hlo", "bench.opt.hlo", "bench.gpu.opt.hlo")


def model_path(name: str, kind: str = "hlo") -> Path:
    return MODELS_DIR / name / f"{name}.{kind}"


def model_io(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, JAX's outputs) at test size."""
    data = np.load(MODELS_DIR / name / f"{name}.npz")
    args = [data[f"arg{i}"] for i in range(sum(k.startswith("arg") for k in data.files))]
    outs = [data[f"out{i}"] for i in range(sum(k.startswith("out") for k in data.files))]
    return args, outs


@pytest.fixture(params=MODEL_NAMES)
def model_name(request) -> str:
    return request.param


_LOADED: dict = {}


def load_fixture(name: str, kind: str = "hlo"):
    """The fixture model `name` loaded once per test session (front end included, lazily)."""
    import hlotune

    if (name, kind) not in _LOADED:
        _LOADED[name, kind] = hlotune.load_model(model_path(name, kind))
    return _LOADED[name, kind]


def distinct_subgraphs(kind: str = "hlo") -> list:
    """(model name, fused subgraph) for every distinct workload key over all fixtures."""
    out, seen = [], set()
    for name in MODEL_NAMES:
        for sg in load_fixture(name, kind).frontend.subgraphs:
            if sg.workload.key not in seen:
                seen.add(sg.workload.key)
                out.append((name, sg))
    return out
