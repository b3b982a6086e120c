"""Hashes of every default CUDA kernel text of the fixtures, to check that a refactor of the code generator changes
no kernel (session 9: the removal of the off-by-default variants kept all 505 texts byte for byte).

    .venv/bin/python benchmarks/cuda_text_hashes.py /tmp/before.json            # before the change
    .venv/bin/python benchmarks/cuda_text_hashes.py /tmp/after.json --compare /tmp/before.json

Texts: every subgraph of every fixture model's five HLO files (test and bench size, XLA's CPU and GPU dumps) with
the default GPU schedule, with and without tensor cores, and three square matmuls with 0, 1 and 3 TF32 passes."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hlotune  # noqa: E402
from hlotune.codegen.cuda import generate_cuda  # noqa: E402
from hlotune.schedule_space.default_gpu import default_gpu_schedule  # noqa: E402
from hlotune.schedule_space.lower import lower  # noqa: E402
from tests.conftest import MODELS_DIR, model_path  # noqa: E402

KINDS = ("hlo", "bench.hlo", "opt.hlo", "bench.opt.hlo", "bench.gpu.opt.hlo")


def _text(cd, opts: dict) -> str:
    try:
        return generate_cuda(lower(cd, default_gpu_schedule(cd, options=dict(opts)), name="k")).text
    except Exception as e:   # a text that cannot be generated is recorded as such (and must stay so)
        return "ERR " + type(e).__name__


def text_hashes() -> dict[str, str]:
    """label -> sha256 prefix of the kernel text."""
    h = (lambda t: hashlib.sha256(t.encode()).hexdigest()[:16])
    out: dict[str, str] = {}
    for name in json.loads((MODELS_DIR / "manifest.json").read_text())["models"]:
        for kind in KINDS:
            path = model_path(name, kind)
            if not Path(path).exists():
                continue
            for sg in hlotune.load_model(str(path)).frontend.subgraphs:
                for opts in ({}, {"tensor_core": 0}):
                    out[f"{name}/{kind}/{sg.name}/{opts}"] = h(_text(sg.workload.compute, opts))
    for n in (256, 1024, 4096):
        hlo = (f"HloModule mm{n}\nENTRY main {{\n  a = f32[{n},{n}] parameter(0)\n  b = f32[{n},{n}] parameter(1)\n"
               f"  ROOT d = f32[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
        (sg,) = hlotune.load_model(hlo).frontend.subgraphs
        for opts in ({}, {"tensor_core": 0}, {"tensor_core": 1}):
            out[f"mm{n}/{opts}"] = h(_text(sg.workload.compute, opts))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--compare", default=None, help="an earlier output: print the labels whose text changed")
    a = ap.parse_args()
    hashes = text_hashes()
    Path(a.out).write_text(json.dumps(hashes, indent=0, sort_keys=True))
    print(f"{len(hashes)} kernel texts -> {a.out}")
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        changed = sorted(k for k in old.keys() | hashes.keys() if old.get(k) != hashes.get(k))
        print(f"{len(changed)} changed" + "".join(f"\n  {k}" for k in changed))
        return 1 if changed else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
