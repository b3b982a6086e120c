"""Compile CUDA C with nvcc (cached on disk), load it through pycuda, check resources, launch and time.

Map:
  compile_cubin(text, arch)        nvcc -cubin -O3 -arch=<arch>; cached under <cache_dir>/cuda/ by
                                   sha256(source, arch, nvcc version, options)
  nvcc_version()                   "13.0" (from `nvcc --version`), None when nvcc is missing
  detect_cuda_target()             Target(kind="cuda") of GPU 0 (registered as the "cuda" detector)
  build_cuda(func, target)         LoopFunc -> CudaKernel (generate, compile, load, resource checks)
  CudaKernel                       `kernel(*arrays)`: numpy arrays (copied in, outputs copied back) or
                                   device arrays (anything with __cuda_array_interface__, used in place);
                                   `launch(*pointers)`, `time(*device_arrays)` (CUDA events)
  time_launches(fn, ...)           CUDA-event timing of any zero-argument launcher

pycuda is imported lazily, so this module imports (and `compile_cubin` works) on machines with nvcc but
no GPU or driver.  Kernels run in the device's primary context (the one PyTorch and CuPy use), so their
device pointers can be passed directly.  nvcc is called directly (not pycuda's SourceModule) so that the
same cache and the same flags serve the no-GPU compile tests and the GPU runs.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache

import numpy as np

from .. import config
from ..errors import CompileError, InputError, UnsupportedError
from ..schedule_space.loop_ir import LoopFunc
from ..target import Target, register_detector
from .cuda import CudaSource, generate_cuda

NVCC_OPTIONS = ("-O3", "--std=c++17")
_LOCK = threading.Lock()
_CTX = None


# ----------------------------------------------------------------------------- nvcc

@cache
def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)


@cache
def nvcc_version() -> str | None:
    """The CUDA toolkit version of nvcc ("13.0"), or None when nvcc is not found."""
    exe = _nvcc()
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def compile_cubin(text: str, arch: str = "sm_90", options: tuple[str, ...] = NVCC_OPTIONS,
                  context: str = "", ptx: bool = False) -> bytes:
    """Compile CUDA C `text` to a cubin (or PTX text) for `arch` (cached on disk); CompileError with nvcc's
    message."""
    exe = _nvcc()
    if exe is None:
        raise UnsupportedError("nvcc (the CUDA compiler) is not installed or not on PATH")
    kind = "ptx" if ptx else "cubin"
    key = hashlib.sha256("\0".join([text, arch, nvcc_version() or "", kind, *options]).encode()).hexdigest()
    cdir = os.path.join(str(config.get("cache_dir")), "cuda")
    path = os.path.join(cdir, f"{key}.{kind}")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hlotune_nvcc_") as d:
        src, out = os.path.join(d, "k.cu"), os.path.join(d, f"k.{kind}")
        with open(src, "w") as f:
            f.write(text)
        r = subprocess.run([exe, f"-{kind}", f"-arch={arch}", *options, "-o", out, src], capture_output=True, text=True)
        if r.returncode != 0:
            where = f" ({context})" if context else ""
            msg = "\n".join(ln for ln in r.stderr.splitlines() if "error" in ln)[:2000] or r.stderr[:2000]
            raise CompileError(f"nvcc failed{where}: {msg}")
        with open(out, "rb") as f:
            data = f.read()
    os.makedirs(cdir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    config.debug(2, "nvcc compiled in %.3f s", time.perf_counter() - t0)
    return data


# ----------------------------------------------------------------------------- device and context

def _drv():
    try:
        import pycuda.driver as drv
    except Exception as e:  # ImportError, or no libcuda
        raise UnsupportedError(f"the CUDA target needs pycuda and an NVIDIA driver: {e}") from None
    return drv


def context():
    """The primary context of GPU 0, made current in this thread (created once)."""
    global _CTX
    drv = _drv()
    with _LOCK:
        if _CTX is None:
            try:
                drv.init()
                if drv.Device.count() == 0:
                    raise UnsupportedError("no CUDA device")
                _CTX = drv.Device(0).retain_primary_context()
                atexit.register(_pop_contexts)
            except drv.Error as e:
                raise UnsupportedError(f"no usable CUDA device: {e}") from None
        try:
            cur = drv.Context.get_current()
        except drv.Error:
            cur = None
        if cur is None or cur.handle != _CTX.handle:
            _CTX.push()
    return _CTX


def _pop_contexts() -> None:
    """Leave the context stack empty at exit (pycuda aborts the process otherwise)."""
    drv = _drv()
    try:
        while drv.Context.get_current() is not None:
            drv.Context.pop()
    except drv.Error:
        pass


@cache
def detect_cuda_target() -> Target:
    """GPU 0 as a Target: name, sm_XY, SM count, shared memory / registers / threads per block, memory,
    CUDA (nvcc) and driver versions."""
    drv = _drv()
    context()
    dev = drv.Device(0)
    a = drv.device_attribute
    major, minor = dev.compute_capability()
    smem = dev.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    drv_ver = drv.get_driver_version()
    tool = f"cuda{nvcc_version() or '.'.join(map(str, drv.get_version()[:2]))}"
    fields = dict(kind="cuda", name=dev.name(), cores=dev.get_attribute(a.MULTIPROCESSOR_COUNT),
                  arch=f"sm_{major}{minor}", shared_mem_bytes=smem,
                  registers_per_block=dev.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
                  max_threads_per_block=dev.get_attribute(a.MAX_THREADS_PER_BLOCK), toolchain=tool,
                  l2_bytes=dev.get_attribute(a.L2_CACHE_SIZE), memory_bytes=dev.total_memory(),
                  driver_version=f"{drv_ver // 1000}.{drv_ver % 1000 // 10}")
    return Target(**fields)


register_detector("cuda", detect_cuda_target)


# ----------------------------------------------------------------------------- kernels

@dataclass
class _Loaded:
    fn: object
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_shared: int
    params: tuple[str, ...]
    registers: int


class CudaKernel:
    """A compiled LoopFunc.  `kernel(*arrays)`: inputs then outputs, numpy arrays of the declared shapes and
    dtypes (outputs are written in place, copied back from the device) or device arrays."""

    def __init__(self, func: LoopFunc, source: CudaSource, cubin: bytes, target: Target, compile_seconds: float):
        self.func = func
        self.source = source
        self.target = target
        self.compile_seconds = compile_seconds
        drv = _drv()
        context()
        self._module = drv.module_from_buffer(cubin)
        self._launches: list[_Loaded] = []
        for ln in source.launches:
            fn = self._module.get_function(ln.name)
            self._check_resources(fn, ln)
            fn.prepare("P" * len(ln.params))
            regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
            self._launches.append(_Loaded(fn, ln.grid, ln.block, ln.dynamic_shared_bytes, ln.params, regs))
        self._temps: dict[str, object] = {}
        self._np = [(p.name, p.dtype.np, tuple(p.shape), i >= len(func.inputs)) for i, p in enumerate(func.params)]

    def __repr__(self) -> str:
        return f"<CudaKernel {self.func.name} ({len(self._launches)} launches, {self.target.fingerprint})>"

    @property
    def text(self) -> str:
        return self.source.text

    def _check_resources(self, fn, ln) -> None:
        drv = _drv()
        fa = drv.function_attribute
        dev = drv.Context.get_device()
        da = drv.device_attribute
        name = f"kernel {ln.name} of {self.func.name}"
        if ln.threads > fn.get_attribute(fa.MAX_THREADS_PER_BLOCK):
            raise CompileError(f"{name}: {ln.threads} threads per block, the compiled kernel allows "
                               f"{fn.get_attribute(fa.MAX_THREADS_PER_BLOCK)} "
                               f"({fn.get_attribute(fa.NUM_REGS)} registers per thread)")
        for k, lim in enumerate((da.MAX_BLOCK_DIM_X, da.MAX_BLOCK_DIM_Y, da.MAX_BLOCK_DIM_Z)):
            if ln.block[k] > dev.get_attribute(lim):
                raise CompileError(f"{name}: block dimension {ln.block} over the device limit")
        for k, lim in enumerate((da.MAX_GRID_DIM_X, da.MAX_GRID_DIM_Y, da.MAX_GRID_DIM_Z)):
            if ln.grid[k] > dev.get_attribute(lim):
                raise CompileError(f"{name}: grid dimension {ln.grid} over the device limit")
        static = fn.get_attribute(fa.SHARED_SIZE_BYTES)
        optin = dev.get_attribute(da.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if static + ln.dynamic_shared_bytes > optin:
            raise CompileError(f"{name}: {static + ln.dynamic_shared_bytes} bytes of shared memory, the device "
                               f"allows {optin} per block")
        if ln.dynamic_shared_bytes > 48 * 1024:
            fn.set_attribute(fa.MAX_DYNAMIC_SHARED_SIZE_BYTES, ln.dynamic_shared_bytes)
        regs = fn.get_attribute(fa.NUM_REGS) * ln.threads
        if regs > dev.get_attribute(da.MAX_REGISTERS_PER_BLOCK):
            raise CompileError(f"{name}: {regs} registers per block over the device limit")

    def _temp_ptrs(self) -> dict[str, int]:
        drv = _drv()
        for t in self.source.temps:
            if t.name not in self._temps:
                n = max(1, int(np.prod(t.shape))) * t.dtype.np.itemsize
                self._temps[t.name] = drv.mem_alloc(n)
        return {k: int(v) for k, v in self._temps.items()}

    def launch(self, ptrs: dict[str, int]) -> None:
        """Launch every kernel on the default stream with buffer name -> device pointer (inputs, outputs)."""
        context()
        allp = dict(ptrs)
        allp.update(self._temp_ptrs())
        for ln in self._launches:
            ln.fn.prepared_call(ln.grid, ln.block, *[allp[n] for n in ln.params], shared_size=ln.dyn_shared)

    def _device_ptrs(self, arrays: tuple) -> tuple[dict[str, int], list, list]:
        """name -> pointer; device allocations to free; (numpy output, device alloc) pairs to copy back."""
        drv = _drv()
        if len(arrays) != len(self._np):
            raise InputError(f"kernel {self.func.name} takes {len(self._np)} arrays (inputs then outputs), "
                             f"got {len(arrays)}")
        ptrs: dict[str, int] = {}
        keep: list = []
        back: list = []
        for (name, dtype, shape, is_out), a in zip(self._np, arrays):
            cai = getattr(a, "__cuda_array_interface__", None)
            if cai is not None:
                if tuple(cai["shape"]) != shape or np.dtype(cai["typestr"]) != dtype:
                    raise InputError(f"buffer {name!r} of kernel {self.func.name}: device array "
                                     f"{cai['typestr']}{tuple(cai['shape'])}, expected {dtype}{shape}")
                if cai.get("strides") not in (None, tuple(np.zeros(shape, dtype).strides)):
                    raise InputError(f"buffer {name!r} of kernel {self.func.name}: device array is not contiguous")
                ptrs[name] = int(cai["data"][0])
                continue
            if is_out and not isinstance(a, np.ndarray):
                raise InputError(f"output {name!r} of kernel {self.func.name} must be a numpy or device array")
            arr = np.asarray(a, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray makes them 1-d)
            if arr.dtype != dtype or arr.shape != shape:
                raise InputError(f"buffer {name!r} of kernel {self.func.name}: {arr.dtype}{arr.shape}, "
                                 f"expected {dtype}{shape}")
            mem = drv.mem_alloc(max(1, arr.nbytes))
            keep.append(mem)
            if not is_out:
                drv.memcpy_htod(mem, arr)
            else:
                back.append((a, mem))
            ptrs[name] = int(mem)
        return ptrs, keep, back

    def __call__(self, *arrays) -> None:
        drv = _drv()
        context()
        ptrs, keep, back = self._device_ptrs(arrays)
        self.launch(ptrs)
        for host, mem in back:
            out = np.empty(host.shape, host.dtype)
            drv.memcpy_dtoh(out, mem)
            host[...] = out
        drv.Context.synchronize()
        del keep

    def time(self, *arrays, warmup: int = 3, min_time: float = 0.05, repeat: int = 5) -> list[float]:
        """Seconds per call (one number per repeat, each the mean over enough calls to last `min_time`),
        timed with CUDA events on device arrays (numpy arrays are copied to the device once)."""
        ptrs, keep, _ = self._device_ptrs(arrays)
        try:
            return time_launches(lambda: self.launch(ptrs), warmup=warmup, min_time=min_time, repeat=repeat)
        finally:
            del keep


def time_launches(fn, warmup: int = 3, min_time: float = 0.05, repeat: int = 5) -> list[float]:
    """Seconds per call of `fn` (which launches asynchronous GPU work), measured with CUDA events."""
    drv = _drv()
    context()
    for _ in range(warmup):
        fn()
    drv.Context.synchronize()
    start, stop = drv.Event(), drv.Event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    one = max(stop.time_since(start) / 1e3, 1e-7)
    n = max(1, min(100000, int(min_time / one)))
    out = []
    for _ in range(repeat):
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        stop.synchronize()
        out.append(stop.time_since(start) / 1e3 / n)
    return out


_KCACHE: dict[tuple[str, str], CudaKernel] = {}


def build_cuda(func: LoopFunc, target: Target | None = None, *, context: str | None = None) -> CudaKernel:
    """Generate, compile (nvcc, disk cache) and load `func` for a cuda target (default: GPU 0).  Raises
    CompileError when code generation, nvcc or the resource checks fail."""
    t = target or detect_cuda_target()
    key = (func.key, t.fingerprint)
    hit = _KCACHE.get(key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    try:
        src = generate_cuda(func)
    except CompileError as e:
        where = f" ({context})" if context else ""
        raise CompileError(f"CUDA code generation for {func.name}{where}: {e.message}") from e
    config.debug(4, "CUDA C of %s:\n%s", func.name, src.text)
    cubin = compile_cubin(src.text, t.arch or "sm_90", context=context or func.name)
    k = CudaKernel(func, src, cubin, t, time.perf_counter() - t0)
    if len(_KCACHE) > 512:
        _KCACHE.clear()
    _KCACHE[key] = k
    return k


__all__ = ["build_cuda", "CudaKernel", "compile_cubin", "detect_cuda_target", "nvcc_version", "time_launches"]
