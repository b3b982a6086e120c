"""JAX-jit baseline for dense layers relu(x @ w + b) of given shapes; runs inside the side venv `.venv-bench`.

    .venv-bench/bin/python benchmarks/jax_dense_side.py [B/]M,K,N[,t] [...] --inputs DIR

Reads DIR/[Bb]M_K_N[_t].npz (x, w, b; with t, w is [.., N, K] and the layer is x @ w.T; with B, x and w have a
leading batch axis and the dot is batched), times the jitted layer on the
CPU device by the shared QUICK rule with `block_until_ready`, writes DIR/[Bb]M_K_N[_t].jax.npy (its output) and prints
one JSON object per shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from common import QUICK, shape_tag, time_calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--inputs", required=True)
    a = ap.parse_args()
    import jax
    import jax.numpy as jnp

    fn = jax.jit(lambda x, w, b: jnp.maximum(x @ w + b, 0.0))
    fn_t = jax.jit(lambda x, w, b: jnp.maximum(x @ jnp.swapaxes(w, -1, -2) + b, 0.0))
    cpu = jax.devices("cpu")[0]
    for shape in a.shapes:
        tag = shape_tag(shape)
        d = np.load(Path(a.inputs) / f"{tag}.npz")
        args = [jax.device_put(d[k], cpu) for k in ("x", "w", "b")]
        f = fn_t if shape.endswith(",t") else fn
        out = f(*args).block_until_ready()
        np.save(Path(a.inputs) / f"{tag}.jax.npy", np.asarray(out))
        t = time_calls(lambda args=args, f=f: f(*args).block_until_ready(), QUICK)
        print(json.dumps({"shape": shape, "median_s": t.median_s, "jax": jax.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
