"""Target descriptions: the machine code is generated for, and its fingerprint for tuning records.

Map:
  Target                  frozen description (kind, LLVM CPU name/features/triple, cores, vector width,
                          cache sizes, LLVM version, schedule format version; GPU fields for "cuda")
  Target.host_cpu()       detect the host CPU (llvmlite + /sys); cached
  Target.from_string()    "cpu" / "host" / "llvm" / "cuda" / a JSON object (Target.to_json)
  .fingerprint / .family  database keys: exact machine+toolchain, and the ISA family used as fallback
  register_detector()     lets a higher layer (the CUDA backend) plug in its own detection
  cuda_cc / cuda_shared_limit(arch)  a CUDA arch's compute capability ("sm_90a" -> 90), and the most shared memory
                          one thread block may take there ("sm_86" -> 99 KB)

This module is at the bottom of the layers: it imports only `config`, `errors` and llvmlite.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InputError, UnsupportedError

#: bump when the meaning of stored schedules changes (steps, lowering); part of every fingerprint
SCHEDULE_FORMAT_VERSION = 1

_CACHE_ROOT = "/sys/devices/system/cpu"

#: shared memory one thread block may take (bytes, with the opt-in for dynamic shared memory past 48 KB), by compute
#: capability (CUDA C++ Programming Guide, technical specifications per compute capability)
_CUDA_SHARED = {70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
                89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 103: 227 * 1024, 120: 99 * 1024}


def cuda_cc(arch: str) -> int | None:
    """The compute capability of a CUDA arch name as an integer ("sm_90a" -> 90, "sm_86" -> 86; None: not one)."""
    digits = arch[3:].rstrip("abf") if arch.startswith("sm_") else ""
    return int(digits) if digits.isdigit() else None


def cuda_shared_limit(arch: str) -> int:
    """Bytes of shared memory one block may take on `arch` ("sm_90", "sm_90a", "sm_86", ...): the table above; an arch
    not in it gets 99 KB from compute capability 7.0 on (the smallest of the recent ones), else 48 KB."""
    cc = cuda_cc(arch)
    if cc is None:
        return 48 * 1024
    return _CUDA_SHARED.get(cc, 99 * 1024 if cc >= 70 else 48 * 1024)


@dataclass(frozen=True)
class Target:
    """What code is generated for.  `cpu` fields come from LLVM's host detection; `cuda` fields
    (arch, sm_count, ...) are filled by the CUDA backend's detector."""

    kind: str                                # "cpu" | "cuda"
    name: str                                # LLVM CPU name (znver3) or GPU name
    features: tuple[str, ...] = ()           # LLVM feature strings that are on ("avx2", "fma", ...)
    triple: str = ""
    cores: int = 1                           # physical cores usable by this process (or SM count)
    vector_bits: int = 128
    l1d_bytes: int | None = None
    l2_bytes: int | None = None
    l3_bytes: int | None = None
    llvm_version: tuple[int, ...] = ()
    schedule_format_version: int = SCHEDULE_FORMAT_VERSION
    # GPU only (None/empty on the CPU)
    arch: str = ""                           # e.g. "sm_90"
    shared_mem_bytes: int | None = None      # per block
    registers_per_block: int | None = None
    max_threads_per_block: int | None = None
    toolchain: str = ""                      # e.g. "cuda12.4"
    memory_bytes: int | None = None          # device memory
    driver_version: str = ""                 # e.g. "580.159" (CUDA driver API version for cuda, e.g. "13.0")

    # ---- construction ---------------------------------------------------------------------------
    @staticmethod
    def host_cpu() -> Target:
        """The host CPU as LLVM sees it (cached per process)."""
        return _host_cpu()

    @staticmethod
    def from_string(text: str) -> Target:
        """`cpu` (or `host`, `llvm`), `cuda`, or the JSON written by `to_json`."""
        t = text.strip()
        if t.startswith("{"):
            return Target.from_json(t)
        kind = {"host": "cpu", "llvm": "cpu", "gpu": "cuda"}.get(t.lower(), t.lower())
        det = _DETECTORS.get(kind)
        if det is None and kind == "cuda":  # the CUDA backend registers its detector when imported
            try:
                importlib.import_module("hlotune.codegen.cuda_runtime")
            except ImportError:
                pass
            det = _DETECTORS.get(kind)
        if det is None:
            if kind == "cuda":
                raise UnsupportedError("target 'cuda' is not available (the CUDA backend is not loaded)")
            raise InputError(f"unknown target {text!r} (expected 'cpu' or 'cuda')")
        return det()

    # ---- keys -----------------------------------------------------------------------------------
    @property
    def isa(self) -> str:
        """The widest vector ISA in short form: avx512, avx2+fma, avx, sse4.2, neon, sve, ..."""
        if self.kind == "cuda":
            return self.arch or "gpu"
        f = set(self.features)
        for tag, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"), ("sse4.2", "sse4.2"),
                          ("sve", "sve"), ("neon", "neon")):
            if tag in f:
                return name + ("+fma" if "fma" in f and name.startswith("avx") else "")
        return "generic"

    @property
    def arch_name(self) -> str:
        """The architecture part of the triple (x86_64, aarch64) or the GPU arch."""
        if self.kind == "cuda":
            return "cuda"
        return self.triple.split("-", 1)[0] if self.triple else "unknown"

    @property
    def fingerprint(self) -> str:
        """Exact key of machine + toolchain, e.g. `cpu-znver3-avx2+fma-2c-llvm20.1-sf1`."""
        llvm = "llvm" + ".".join(str(v) for v in self.llvm_version[:2])
        name = self.name.replace(" ", "_").replace("-", "_").lower()
        if self.kind == "cuda":
            tool = self.toolchain or "cuda"
            return f"cuda-{name}-{self.arch}-{self.cores}sm-{tool}-{llvm}-sf{self.schedule_format_version}"
        return f"cpu-{name}-{self.isa}-{self.cores}c-{llvm}-sf{self.schedule_format_version}"

    @property
    def family(self) -> str:
        """ISA family used when no record matches the exact fingerprint, e.g. `cpu-x86_64-avx2`."""
        if self.kind == "cuda":
            return f"cuda-{self.arch or 'gpu'}"
        return f"cpu-{self.arch_name}-{self.isa.split('+')[0]}"

    @property
    def llvm_features(self) -> str:
        """The feature string for LLVM's target machine (`+avx2,+fma,...`)."""
        return ",".join("+" + f for f in self.features)

    # ---- (de)serialization ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["features"] = list(self.features)
        d["llvm_version"] = list(self.llvm_version)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_json(text: str | dict[str, Any]) -> Target:
        try:
            d = json.loads(text) if isinstance(text, str) else dict(text)
            if not isinstance(d, dict):
                raise TypeError("expected a JSON object")
            d["features"] = tuple(d.get("features", ()))
            d["llvm_version"] = tuple(d.get("llvm_version", ()))
            known = {f.name for f in dataclasses.fields(Target)}
            return Target(**{k: v for k, v in d.items() if k in known})
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise InputError(f"not a target description: {e}") from None

    def __str__(self) -> str:
        return self.fingerprint


# ---- host detection -------------------------------------------------------------------------------

def _llvm():
    import llvmlite.binding as llvm
    return llvm


@functools.cache
def _host_cpu() -> Target:
    llvm = _llvm()
    name = llvm.get_host_cpu_name()
    try:
        fmap = llvm.get_host_cpu_features()
        features = tuple(sorted(k for k, on in fmap.items() if on))
    except RuntimeError:  # some platforms cannot list features
        features = ()
    l1, l2, l3 = _cache_sizes()
    return Target(kind="cpu", name=name, features=features, triple=llvm.get_process_triple(),
                  cores=_physical_cores(), vector_bits=_vector_bits(features),
                  l1d_bytes=l1, l2_bytes=l2, l3_bytes=l3, llvm_version=tuple(llvm.llvm_version_info))


def _vector_bits(features: tuple[str, ...]) -> int:
    f = set(features)
    if "avx512f" in f:
        return 512
    if "avx" in f or "avx2" in f:
        return 256
    return 128


def _physical_cores() -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
    seen = set()
    for c in cpus:
        base = f"{_CACHE_ROOT}/cpu{c}/topology"
        try:
            with open(f"{base}/core_id") as fc, open(f"{base}/physical_package_id") as fp:
                seen.add((fp.read().strip(), fc.read().strip()))
        except OSError:
            seen.add(("cpu", str(c)))
    return max(1, len(seen))


def _parse_size(text: str) -> int | None:
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    try:
        if t and t[-1] in mult:
            return int(t[:-1]) * mult[t[-1]]
        return int(t)
    except ValueError:
        return None


def _cache_sizes(root: str = f"{_CACHE_ROOT}/cpu0/cache") -> tuple[int | None, int | None, int | None]:
    """(L1d, L2, L3) sizes in bytes from sysfs; None where unknown."""
    found: dict[int, int | None] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None, None, None
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            with open(f"{root}/{e}/level") as f:
                level = int(f.read())
            with open(f"{root}/{e}/type") as f:
                kind = f.read().strip()
            with open(f"{root}/{e}/size") as f:
                size = _parse_size(f.read())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            found[level] = size
    return found.get(1), found.get(2), found.get(3)


_DETECTORS: dict[str, Callable[[], Target]] = {"cpu": _host_cpu}


def register_detector(kind: str, detect: Callable[[], Target]) -> None:
    """Make `Target.from_string(kind)` call `detect` (the CUDA backend registers "cuda")."""
    _DETECTORS[kind] = detect
