"""Target description: host detection, fingerprint/family keys, JSON round trip."""

from __future__ import annotations

import os

import llvmlite.binding as llvm
import pytest

from hlotune.errors import InputError, UnsupportedError
from hlotune.target import SCHEDULE_FORMAT_VERSION, Target, _cache_sizes, _parse_size


def test_host_cpu_matches_llvm_and_os():
    t = Target.host_cpu()
    assert t.kind == "cpu"
    assert t.name == llvm.get_host_cpu_name()
    assert t.triple == llvm.get_process_triple()
    assert t.llvm_version == tuple(llvm.llvm_version_info)
    assert 1 <= t.cores <= len(os.sched_getaffinity(0))
    feats = {k for k, on in llvm.get_host_cpu_features().items() if on}
    assert set(t.features) == feats
    expect_bits = 512 if "avx512f" in feats else 256 if "avx" in feats else 128
    assert t.vector_bits == expect_bits
    assert Target.from_string("cpu") == t and Target.from_string("host") == t
    assert t.schedule_format_version == SCHEDULE_FORMAT_VERSION


def test_fingerprint_and_family_format():
    t = Target(kind="cpu", name="znver3", features=("avx", "avx2", "fma", "sse4.2"), triple="x86_64-unknown-linux-gnu",
               cores=2, vector_bits=256, llvm_version=(20, 1, 8))
    assert t.fingerprint == f"cpu-znver3-avx2+fma-2c-llvm20.1-sf{SCHEDULE_FORMAT_VERSION}"
    assert t.family == "cpu-x86_64-avx2"
    assert t.llvm_features == "+avx,+avx2,+fma,+sse4.2"
    # a different core count or LLVM changes the fingerprint, not the family
    t4 = Target(**{**t.to_dict(), "cores": 4, "features": t.features, "llvm_version": (21, 1)})
    assert t4.fingerprint != t.fingerprint and t4.family == t.family
    arm = Target(kind="cpu", name="neoverse-v1", features=("neon", "sve"), triple="aarch64-unknown-linux-gnu",
                 cores=8, llvm_version=(20, 1))
    assert arm.family == "cpu-aarch64-sve"
    avx512 = Target(kind="cpu", name="icelake-server", features=("avx2", "avx512f", "fma"), triple="x86_64-pc-linux")
    assert avx512.isa == "avx512+fma" and avx512.family == "cpu-x86_64-avx512"


def test_json_round_trip():
    t = Target.host_cpu()
    back = Target.from_json(t.to_json())
    assert back == t and back.fingerprint == t.fingerprint
    assert Target.from_string(t.to_json()) == t
    with pytest.raises(InputError):
        Target.from_json("[1, 2]")


def test_unknown_targets():
    with pytest.raises(InputError, match="unknown target"):
        Target.from_string("tpu")
    with pytest.raises(UnsupportedError):
        Target.from_string("cuda")


def test_cache_sizes_from_sysfs(tmp_path):
    for idx, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"),
                                               (3, "Unified", "32768K")]):
        d = tmp_path / f"index{idx}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert _cache_sizes(str(tmp_path)) == (32 * 1024, 512 * 1024, 32 * 1024 * 1024)
    assert _cache_sizes(str(tmp_path / "missing")) == (None, None, None)
    assert _parse_size("2M") == 2 * 1024 * 1024 and _parse_size("bogus") is None
