"""JAX-jit baseline for one fixture model at bench size; runs inside the side venv `.venv-bench`.

    .venv-bench/bin/python benchmarks/jax_side.py NAME --inputs IN.npz --outputs OUT.npz [--quick]

Builds the model from its `jax_source` in manifest.json (function name = model name), puts the
inputs (arg0.. from IN.npz) on the CPU device, times the first call (trace + compile + run), then
warm-up and repeats by the shared timing rule with `block_until_ready`.  Writes JAX's outputs
(out0.., tree-leaves order) to OUT.npz and one JSON object on stdout.

Map: build(name, entry) -> jitted function;  main() -> JSON {model, jax, first_call_s, timing}
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from common import FULL, QUICK, load_manifest, time_calls, warm_malloc


def build(name: str, entry: dict):
    import jax
    import jax.numpy as jnp

    scope = {"jax": jax, "jnp": jnp, "np": np}
    exec(compile(entry["jax_source"], f"<manifest:{name}>", "exec"), scope)  # noqa: S102 - fixture source
    return jax.jit(scope[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--outputs", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    warm_malloc()   # the harness also starts this process with the MALLOC_* env; kept for direct runs
    import jax

    entry = load_manifest()["models"][a.model]
    with np.load(a.inputs) as z:
        args = [z[f"arg{i}"] for i in range(len(z.files))]
    fn = build(a.model, entry)
    dargs = [jax.device_put(x) for x in args]
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*dargs))
    first = time.perf_counter() - t0
    timing = time_calls(lambda: jax.block_until_ready(fn(*dargs)), QUICK if a.quick else FULL)
    leaves = jax.tree_util.tree_leaves(out)
    np.savez(a.outputs, **{f"out{i}": np.asarray(x) for i, x in enumerate(leaves)})
    res = {"model": a.model, "jax": jax.__version__, "jaxlib": getattr(jax, "__version__", "?"),
           "numpy": np.__version__, "devices": [str(d) for d in jax.devices()], "first_call_s": first,
           "timing": timing.to_json()}
    try:
        import jaxlib

        res["jaxlib"] = jaxlib.__version__
    except (ImportError, AttributeError):
        pass
    json.dump(res, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
