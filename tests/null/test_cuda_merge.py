"""Small kernels of one function joined into one (`codegen.cuda.MERGE_SMALL_KERNELS`, `_merge_small`), without a GPU:
which kernels join (one block, or a few blocks of little work whose block loops run serially), the barrier between
them, the launch count of mlp_train_step's subgraphs (23 -> 15 kernels), and that a join the code generator cannot
compile is not made.  On the GPU, tests/gpu/test_merge.py checks the joined kernels' outputs."""

from __future__ import annotations

import pytest

import hlotune
import hlotune.codegen.cuda as cuda
from hlotune.codegen.cuda import _merge_small, _one_block, _work, generate_cuda
from hlotune.errors import CompileError
from hlotune.ir.expr import INDEX, Const, Var
from hlotune.ir.hlo import DType
from hlotune.schedule_space.default_gpu import default_gpu_schedule
from hlotune.schedule_space.loop_ir import Barrier, For, ForKind, Seq, Store, walk_stmts
from hlotune.schedule_space.lower import lower
from tests.conftest import model_path


def _launches(name: str, kind: str, merge: bool, monkeypatch) -> list[list]:
    monkeypatch.setattr(cuda, "MERGE_SMALL_KERNELS", merge)
    out = []
    for sg in hlotune.load_model(str(model_path(name, kind))).frontend.subgraphs:
        cd = sg.workload.compute
        out.append(list(generate_cuda(lower(cd, default_gpu_schedule(cd), name="k")).launches))
    return out


def test_mlp_train_step_kernels_joined(monkeypatch):
    off = _launches("mlp_train_step", "bench.hlo", False, monkeypatch)
    on = _launches("mlp_train_step", "bench.hlo", True, monkeypatch)
    # 23 / 15 before session 11's split-K dots (the forward dot's and the weight gradient's sums: a kernel each more)
    assert sum(map(len, off)) == 26 and sum(map(len, on)) == 17
    for a, b in zip(off, on):
        assert 1 <= len(b) <= len(a)
        if len(b) < len(a):   # a join: one block, one dimension
            assert len(b) == 1 and b[0].grid == (1, 1, 1) and b[0].block[1:] == (1, 1)
    # kernels of many blocks are left alone (the dots)
    assert [ln.grid for ln in on[0]] == [ln.grid for ln in off[0]] and on[0][0].grid[0] > cuda.SMALL_GRID


def test_joined_text_has_a_barrier_between_the_kernels(monkeypatch):
    monkeypatch.setattr(cuda, "MERGE_SMALL_KERNELS", True)
    sgs = {sg.name: sg for sg in hlotune.load_model(str(model_path("mlp_train_step", "bench.hlo"))).frontend.subgraphs}
    cd = sgs["input_fusion"].workload.compute
    src = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k"))
    monkeypatch.setattr(cuda, "MERGE_SMALL_KERNELS", False)
    apart = generate_cuda(lower(cd, default_gpu_schedule(cd), name="k"))
    assert len(src.launches) == 1 and len(apart.launches) == 5
    # at least one barrier per join (four joins) on top of the kernels' own
    assert src.text.count("__syncthreads()") >= apart.text.count("__syncthreads()") + 4


def _nest(blocks: int, threads: int, per: int, name: str = "b"):
    i = Var(f"{name}i", INDEX)
    body = Store(name, (i,), Const(0.0, DType.F32))
    inner = For(i, Const(0, INDEX), Const(per, INDEX), ForKind.SERIAL, body)
    t = For(Var(f"{name}t", INDEX), Const(0, INDEX), Const(threads, INDEX), ForKind.THREAD_X, inner)
    return For(Var(f"{name}b", INDEX), Const(0, INDEX), Const(blocks, INDEX), ForKind.BLOCK_X, t)


def test_one_block_rule():
    one = _nest(1, 256, 4)
    assert _one_block(one) is one
    few = _nest(3, 256, 4)
    assert _work(few) == 3 * 256 * 4
    got = _one_block(few)
    assert got is not None and not any(isinstance(f, For) and f.kind is ForKind.BLOCK_X for f in walk_stmts(got))
    assert _one_block(_nest(cuda.SMALL_GRID + 1, 32, 1)) is None          # too many blocks
    assert _one_block(_nest(2, 256, cuda.SMALL_WORK)) is None             # too much work


class _Launch:
    def __init__(self, grid, block):
        self.grid, self.block = grid, block


def test_merge_keeps_only_joins_that_compile():
    a, b, c, big = _nest(1, 256, 2, "a"), _nest(1, 256, 2, "b"), _nest(1, 32, 2, "c"), _nest(64, 256, 64, "g")

    def fine(k):
        return "", _Launch((1, 1, 1), (256, 1, 1))

    out = _merge_small([a, b, big, c], fine)
    assert len(out) == 3 and out[1] is big and out[2] is c
    assert isinstance(out[0], Seq) and [type(x) for x in out[0].body] == [For, Barrier, For]

    def refuse_c(k):
        if any(isinstance(f, For) and f.var.name == "ct" for f in walk_stmts(k)):
            raise CompileError("no")
        return "", _Launch((1, 1, 1), (256, 1, 1))

    out = _merge_small([a, b, c], refuse_c)
    assert len(out) == 2 and isinstance(out[0], Seq) and out[1] is c

    def two_d(k):
        return "", _Launch((1, 1, 1), (32, 8, 1))

    assert _merge_small([a, b], two_d) == [a, b]     # a 2-D block: no join


@pytest.mark.parametrize("name", ["sum_reduce", "transformer_block", "softmax"])
def test_other_models_compile_with_joins(name, monkeypatch):
    on = _launches(name, "bench.hlo", True, monkeypatch)
    off = _launches(name, "bench.hlo", False, monkeypatch)
    assert sum(map(len, on)) <= sum(map(len, off))
