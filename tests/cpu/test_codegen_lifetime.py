"""Compiled kernels can be created and dropped many times (tuning builds thousands): the JIT engine of a
dropped kernel must not take shared LLVM objects (the cached TargetMachine) down with it."""

import gc
import subprocess
import sys
import textwrap

import numpy as np

import hlotune
from hlotune.codegen import llvm_cpu

TINY = "HloModule t\n\nENTRY main {\n  p = f32[8]{0} parameter(0)\n  ROOT a = f32[8]{0} add(p, p)\n}\n"
RELU = ("HloModule r\n\nENTRY main {\n  p = f32[64,256]{1,0} parameter(0)\n  c = f32[] constant(0)\n"
        "  b = f32[64,256]{1,0} broadcast(c), dimensions={}\n  ROOT m = f32[64,256]{1,0} maximum(p, b)\n}\n")


def _cycle(n: int) -> None:
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    for k in range(n):
        for text, arg, ref in ((TINY, np.full(8, k, np.float32), np.full(8, 2 * k, np.float32)),
                               (RELU, x, np.maximum(x, 0))):
            exe = hlotune.compile(text)
            np.testing.assert_array_equal(exe(arg)[0], ref)
            llvm_cpu.clear_cache()
            del exe
            gc.collect()


def test_compile_drop_compile_many_times():
    _cycle(12)


def test_compile_drop_in_fresh_process():
    """The original crash: compile, clear the cache, drop, compile again (segfault, exit -11).  A fresh
    process, so the crash (if it comes back) is a test failure rather than the end of the test run."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {repr(str(__import__('pathlib').Path(__file__).parent))})
        from test_codegen_lifetime import _cycle
        _cycle(4)
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, (r.returncode, r.stderr[-2000:])
