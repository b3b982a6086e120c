"""Compile CUDA C with nvcc (cached on disk), load it through pycuda, check resources, launch and time.

Map:
  compile_cubin(text, arch)        nvcc -cubin -O3 -arch=<arch>; cached under <cache_dir>/cuda/ by
                                   sha256(source, arch, nvcc version, options); sm_90a for wgmma texts
                                   (`kernel_arch`)
  nvcc_version()                   "13.0" (from `nvcc --version`), None when nvcc is missing
  detect_cuda_target()             Target(kind="cuda") of GPU 0 (registered as the "cuda" detector)
  build_cuda(func, target)         LoopFunc -> CudaKernel (generate, compile, load, resource checks)
  CudaKernel                       `kernel(*arrays)`: numpy arrays (copied in, outputs copied back) or
                                   device arrays (anything with __cuda_array_interface__, used in place);
                                   `launch(*pointers)`, `time(*device_arrays)` (CUDA events)
  time_launches(fn, ...)           CUDA-event timing of any zero-argument launcher
  LaunchProgram                    a whole model's launches over a pointer table: driver-API launches by ctypes
                                   (`cuLaunchKernel`), a CUDA graph per pointer set seen twice (`USE_GRAPHS`)
  device_pointer(obj, shape, dtype)  checked device pointer of a DeviceArray / torch tensor / CAI object
  DeviceArray                      a device buffer from the memory pool (shape, dtype, __cuda_array_interface__,
                                   `get()` -> numpy); `to_device(np)`, `empty_device(shape, dtype)`,
                                   `as_device(obj)` (a view of any __cuda_array_interface__ object)
  source_artifact / kernel_from_artifact   what a builder process sends a GPU runner: cubin bytes + the
                                   launches and temporaries as JSON (BuildResult.obj / .symbol)

pycuda is imported lazily, so this module imports (and `compile_cubin` works) on machines with nvcc but
no GPU or driver.  Kernels run in the device's primary context (the one PyTorch and CuPy use), so their
device pointers can be passed directly.  nvcc is called directly (not pycuda's SourceModule) so that the
same cache and the same flags serve the no-GPU compile tests and the GPU runs.
"""

from __future__ import annotations

import atexit
import ctypes
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
from .cuda import CudaSource, Launch, generate_cuda

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


def kernel_arch(text: str, arch: str) -> str:
    """The arch a source is compiled for: sm_90a (Hopper's arch-specific features) for texts that use wgmma
    (`codegen.cuda_wgmma`) when `arch` is sm_90, else `arch`."""
    return "sm_90a" if arch == "sm_90" and "wgmma.mma_async" in text else arch


def compile_cubin(text: str, arch: str = "sm_90", options: tuple[str, ...] = NVCC_OPTIONS,
                  context: str = "", ptx: bool = False) -> bytes:
    """Compile CUDA C `text` to a cubin (or PTX text) for `arch` (cached on disk); CompileError with nvcc's
    message."""
    exe = _nvcc()
    if exe is None:
        raise UnsupportedError("nvcc (the CUDA compiler) is not installed or not on PATH")
    arch = kernel_arch(text, arch)
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
    drv_txt = f"{drv_ver // 1000}.{drv_ver % 1000 // 10}"
    tool = f"cuda{nvcc_version() or '.'.join(map(str, drv.get_version()[:2]))}-drv{drv_txt}"
    fields = dict(kind="cuda", name=dev.name(), cores=dev.get_attribute(a.MULTIPROCESSOR_COUNT),
                  arch=f"sm_{major}{minor}", shared_mem_bytes=smem,
                  registers_per_block=dev.get_attribute(a.MAX_REGISTERS_PER_BLOCK),
                  max_threads_per_block=dev.get_attribute(a.MAX_THREADS_PER_BLOCK), toolchain=tool,
                  l2_bytes=dev.get_attribute(a.L2_CACHE_SIZE), memory_bytes=dev.total_memory(),
                  driver_version=drv_txt)
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
        self.cubin = cubin
        self._driver_fns: list | None = None
        self._module = drv.module_from_buffer(cubin)
        self._launches: list[_Loaded] = []
        for ln in source.launches:
            fn = self._module.get_function(ln.name)
            self._check_resources(fn, ln)
            fn.prepare("P" * len(ln.params))
            regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
            self._launches.append(_Loaded(fn, ln.grid, ln.block, ln.dynamic_shared_bytes, ln.params, regs))
        self._temps: dict[str, object] = {}
        self._order = None
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

    def driver_functions(self) -> list[tuple[int, Launch]]:
        """(CUfunction handle, launch) of every kernel, loaded through the driver API (`LaunchProgram`)."""
        if self._driver_fns is None:
            cu = _culib()
            context()
            mod = ctypes.c_void_p()
            _cu_check(cu.cuModuleLoadData(ctypes.byref(mod), self.cubin), "cuModuleLoadData")
            self._cu_module = mod
            out = []
            for ln in self.source.launches:
                fn = ctypes.c_void_p()
                _cu_check(cu.cuModuleGetFunction(ctypes.byref(fn), mod, ln.name.encode()), "cuModuleGetFunction")
                if ln.dynamic_shared_bytes > 48 * 1024:   # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    _cu_check(cu.cuFuncSetAttribute(fn, 8, ln.dynamic_shared_bytes), "cuFuncSetAttribute")
                out.append((fn.value, ln))
            self._driver_fns = out
        return self._driver_fns

    def temp_pointers(self) -> dict[str, int]:
        """Device pointers of the kernel's global temporaries (allocated once)."""
        return self._temp_ptrs()

    def call_unchecked(self, ptrs) -> None:
        """Launch on raw device pointers in parameter order (inputs then outputs), no checks (the whole-model
        executable's own buffers)."""
        order = self._order
        if order is None:
            names = [p.name for p in self.func.params]
            temps = self._temp_ptrs()
            self._order = order = [(ln, [names.index(n) if n in names else -1 - list(temps).index(n)
                                         for n in ln.params], [temps.get(n) for n in ln.params])
                                   for ln in self._launches]
        for ln, idx, tp in order:
            ln.fn.prepared_call(ln.grid, ln.block, *[ptrs[i] if i >= 0 else t for i, t in zip(idx, tp)],
                                shared_size=ln.dyn_shared)

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
                if cai.get("strides") is not None and tuple(cai["strides"]) != _c_strides(shape, dtype):
                    raise InputError(f"buffer {name!r} of kernel {self.func.name}: device array is not contiguous")
                if int(cai["data"][0]) % 16:
                    raise InputError(f"buffer {name!r} of kernel {self.func.name}: device array is not 16-byte "
                                     f"aligned (kernels use float4 accesses)")
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


# ----------------------------------------------------------------------------- launch programs (driver API)

@cache
def _culib():
    """libcuda through ctypes (cuLaunchKernel and friends), for launches with little Python per kernel."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise UnsupportedError(f"the CUDA driver library is not loadable: {e}") from None
    vp, u = ctypes.c_void_p, ctypes.c_uint
    lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
    lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, vp]
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(vp), u]
    lib.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
    lib.cuStreamEndCapture.argtypes = [vp, ctypes.POINTER(vp)]
    lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_ulonglong]
    lib.cuGraphLaunch.argtypes = [vp, vp]
    lib.cuGraphDestroy.argtypes = [vp]
    lib.cuGraphExecDestroy.argtypes = [vp]
    lib.cuStreamDestroy_v2.argtypes = [vp]
    return lib


def _cu_check(rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        _culib().cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"CUDA error {rc} in {what}: {(msg.value or b'?').decode()}")


#: LaunchProgram.run(key): replay a CUDA graph for a pointer set seen before (captured on its second use)
USE_GRAPHS = True
GRAPH_CACHE = 16      # graphs kept per program (least recently captured dropped first)


class LaunchProgram:
    """A fixed sequence of kernel launches and device-to-device copies over a table of pointer slots (a numpy
    uint64 array; kernel arguments point into it), run with one ctypes call per launch: a whole model's kernels
    cost a few microseconds of Python per call.  Build: `slot(value)`, `kernel(k, slots)`, `copy(dst, src, n)`,
    `finish()`; run: write the changing pointers into `slots`, then `run(key)` with `key` the tuple of those
    pointers: the second time a key is seen the launches are captured into a CUDA graph (stream capture,
    instantiated once), and from then on that key replays the graph with one driver call (`graph_launches`
    counts them); other keys launch kernel by kernel.  The graph holds the pointer values of its key, and every
    other pointer (constants, intermediates, temporaries) never changes, so a replay is exactly the launches."""

    def __init__(self):
        self._init: list[int] = []
        self._steps: list[tuple] = []
        self.slots: np.ndarray | None = None
        self._calls: list[tuple] = []
        self.n_kernels = 0
        self._graphs: dict[tuple, int] = {}
        self._seen: dict[tuple, int] = {}
        self._stream = None
        self.graph_launches = 0
        self.captures = 0

    def slot(self, value: int = 0) -> int:
        """A new slot (its index), holding `value` until changed."""
        self._init.append(int(value))
        return len(self._init) - 1

    def kernel(self, k: CudaKernel, slots: list[int]) -> None:
        """Launch every kernel of `k` with its parameters (inputs then outputs, `k.func.params` order) in `slots`."""
        names = [p.name for p in k.func.params]
        temps = {n: self.slot(v) for n, v in k.temp_pointers().items()}
        for fn, ln in k.driver_functions():
            args = [slots[names.index(n)] if n in names else temps[n] for n in ln.params]
            self._steps.append(("k", fn, ln, args))
            self.n_kernels += 1

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._steps.append(("c", dst, src, nbytes))

    def finish(self) -> LaunchProgram:
        self.slots = np.array(self._init, dtype=np.uint64)
        base = self.slots.ctypes.data
        cu = _culib()
        for st in self._steps:
            if st[0] == "k":
                _, fn, ln, args = st
                params = (ctypes.c_void_p * max(1, len(args)))(*[base + 8 * a for a in args])
                self._calls.append((cu.cuLaunchKernel, (fn, *ln.grid, *ln.block, ln.dynamic_shared_bytes, None,
                                                        params, None), params))
            else:
                _, dst, src, n = st
                self._calls.append((self._copy, (dst, src, n), None))
        return self

    def _copy(self, dst: int, src: int, n: int, stream=None) -> int:
        s = self.slots
        return _culib().cuMemcpyDtoDAsync_v2(int(s[dst]), int(s[src]), n, stream)

    def run(self, key: tuple | None = None) -> None:
        """Launch everything on the default stream (asynchronous); `key`: the pointers written into `slots` for
        this call (a CUDA graph per key seen twice, see the class)."""
        if key is not None and USE_GRAPHS:
            g = self._graphs.get(key)
            if g is None and self._seen.get(key, 0) >= 1:
                g = self._capture(key)
            if g is not None:
                rc = _culib().cuGraphLaunch(g, None)
                if rc == 0:
                    self.graph_launches += 1
                    return
                _cu_check(rc, "cuGraphLaunch")
            if len(self._seen) > 4096:
                self._seen.clear()
            self._seen[key] = self._seen.get(key, 0) + 1
        for fn, args, _ in self._calls:
            rc = fn(*args)
            if rc:
                if rc == 201:   # CUDA_ERROR_INVALID_CONTEXT: this thread has no current context yet
                    context()
                    rc = fn(*args)
                _cu_check(rc, "cuLaunchKernel")

    def close(self) -> None:
        """Destroy the captured graphs and the capture stream (the program can still run, uncaptured keys first)."""
        cu = _culib()
        for g in self._graphs.values():
            cu.cuGraphExecDestroy(g)
        self._graphs.clear()
        self._seen.clear()
        if self._stream is not None:
            cu.cuStreamDestroy_v2(self._stream)
            self._stream = None

    def _capture(self, key: tuple) -> int | None:
        """A CUDA graph of the launches with the current slot values (None where capture fails: the caller then
        launches kernel by kernel)."""
        cu = _culib()
        if self._stream is None:
            st = ctypes.c_void_p()
            _cu_check(cu.cuStreamCreate(ctypes.byref(st), 1), "cuStreamCreate")   # CU_STREAM_NON_BLOCKING
            self._stream = st
        st = self._stream
        if cu.cuStreamBeginCapture_v2(st, 1):    # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            return None
        ok = True
        for fn, args, _ in self._calls:
            if fn is self._copy:
                ok = ok and fn(*args, st) == 0
            else:
                ok = ok and fn(*args[:8], st, *args[9:]) == 0
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        rc = cu.cuStreamEndCapture(st, ctypes.byref(graph))
        if rc or not ok:
            return None
        rc = cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0)
        cu.cuGraphDestroy(graph)
        if rc:
            return None
        if len(self._graphs) >= GRAPH_CACHE:
            old = next(iter(self._graphs))
            cu.cuGraphExecDestroy(self._graphs.pop(old))
        self._graphs[key] = exe.value
        self.captures += 1
        return exe.value


# ----------------------------------------------------------------------------- device arrays

_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        context()
        import pycuda.tools
        _POOL = pycuda.tools.DeviceMemoryPool()
    return _POOL


class DeviceArray:
    """A C-contiguous array in device memory (from a pool: freeing it returns the memory for reuse).
    Exposes `__cuda_array_interface__`, so `torch.as_tensor(a, device="cuda")` and `cupy.asarray(a)` use it
    without a copy; `get()` copies it to a numpy array."""

    __slots__ = ("shape", "dtype", "ptr", "_owner", "__weakref__")

    def __init__(self, shape, dtype, ptr: int, owner=None):
        self.shape = tuple(int(x) for x in shape)
        self.dtype = np.dtype(dtype)
        self.ptr = int(ptr)
        self._owner = owner

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}

    def get(self) -> np.ndarray:
        """A numpy copy (synchronous)."""
        out = np.empty(self.shape, self.dtype)
        if out.nbytes:
            _drv().memcpy_dtoh(out, self.ptr)
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.get()
        return a if dtype is None else a.astype(dtype)

    def reshape(self, shape) -> DeviceArray:
        """A view with another shape (same number of elements)."""
        shape = tuple(int(x) for x in shape)
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(self.shape, dtype=np.int64)):
            raise InputError(f"cannot reshape a device array of shape {self.shape} to {shape}")
        return DeviceArray(shape, self.dtype, self.ptr, self)

    def copy(self) -> DeviceArray:
        out = empty_device(self.shape, self.dtype)
        if self.nbytes:
            _drv().memcpy_dtod_async(out.ptr, self.ptr, self.nbytes)
        return out

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}{list(self.shape)} at 0x{self.ptr:x})"


def _c_strides(shape, dtype) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array (computed, not allocated: np.zeros(shape) costs a pass over memory)."""
    out, step = [], np.dtype(dtype).itemsize
    for n in reversed(tuple(shape)):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def empty_device(shape, dtype) -> DeviceArray:
    """An uninitialized device array (pool memory)."""
    dt = np.dtype(dtype)
    n = max(1, int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
    mem = _pool().allocate(n)
    return DeviceArray(shape, dt, int(mem), mem)


def to_device(a) -> DeviceArray:
    """A device copy of a numpy array (synchronous; a 0-d array stays 0-d)."""
    arr = np.asarray(a, order="C")
    out = empty_device(arr.shape, arr.dtype)
    if arr.nbytes:
        _drv().memcpy_htod(out.ptr, arr)
    return out


def as_device(obj, shape=None, dtype=None, what: str = "argument") -> DeviceArray:
    """A DeviceArray view of `obj` (anything with __cuda_array_interface__, C-contiguous), checked against
    `shape` / `dtype` when given."""
    if isinstance(obj, DeviceArray):
        d = obj
    else:
        cai = obj.__cuda_array_interface__
        shp, dt = tuple(cai["shape"]), np.dtype(cai["typestr"])
        if cai.get("strides") is not None and tuple(cai["strides"]) != _c_strides(shp, dt) and int(np.prod(shp)) > 1:
            raise InputError(f"{what}: device array is not C-contiguous")
        d = DeviceArray(shp, dt, int(cai["data"][0]), obj)
    if shape is not None and tuple(d.shape) != tuple(shape):
        raise InputError(f"{what}: expected shape {list(shape)}, got {list(d.shape)}")
    if dtype is not None and d.dtype != np.dtype(dtype):
        raise InputError(f"{what}: expected dtype {np.dtype(dtype)}, got {d.dtype}")
    return d


def device_pointer(obj, shape: tuple[int, ...], dtype: np.dtype, what: str = "argument") -> int:
    """The device pointer of `obj` (a DeviceArray, a CUDA torch.Tensor or anything with
    __cuda_array_interface__), checked against `shape` and `dtype` and for C-contiguity; InputError otherwise.
    The whole-model fast path: a torch tensor is read through `data_ptr()` (its __cuda_array_interface__ is a
    Python property costing several microseconds)."""
    if isinstance(obj, DeviceArray):
        if obj.shape != shape or obj.dtype != dtype:
            raise InputError(f"{what}: expected {np.dtype(dtype)}{list(shape)}, got {obj.dtype}{list(obj.shape)}")
        return obj.ptr
    if getattr(obj, "is_cuda", False) and hasattr(obj, "data_ptr"):   # torch.Tensor
        dt = _TORCH_DTYPES.get(obj.dtype)
        if dt is None:
            try:
                dt = _TORCH_DTYPES[obj.dtype] = np.dtype(str(obj.dtype).rpartition(".")[2])
            except TypeError:
                dt = _TORCH_DTYPES[obj.dtype] = np.dtype("V1")
        if tuple(obj.shape) != shape or dt != dtype:
            raise InputError(f"{what}: expected {np.dtype(dtype)}{list(shape)}, got {obj.dtype}{list(obj.shape)}")
        if not obj.is_contiguous():
            raise InputError(f"{what}: device array is not C-contiguous")
        return obj.data_ptr()
    return as_device(obj, shape, dtype, what).ptr


_TORCH_DTYPES: dict = {}


def _new_device_array(shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> DeviceArray:
    """empty_device without the argument normalisation (shape a tuple of ints, dtype a numpy dtype)."""
    mem = _pool().allocate(max(1, nbytes))
    d = DeviceArray.__new__(DeviceArray)
    d.shape, d.dtype, d.ptr, d._owner = shape, dtype, int(mem), mem
    return d


def synchronize() -> None:
    """Wait for all work on the device."""
    context()
    _drv().Context.synchronize()


# ----------------------------------------------------------------------------- builder <-> runner artifacts

def source_artifact(src: CudaSource) -> str:
    """The launches and temporaries of `src` as JSON (the cubin travels separately)."""
    import json
    return json.dumps({"launches": [[ln.name, list(ln.grid), list(ln.block), ln.shared_bytes,
                                     ln.dynamic_shared_bytes, list(ln.params)] for ln in src.launches],
                       "temps": [[t.name, list(t.shape), t.dtype.value] for t in src.temps],
                       "index_bits": src.index_bits})


def kernel_from_artifact(func: LoopFunc, cubin: bytes, artifact: str, target: Target,
                         compile_seconds: float = 0.0) -> CudaKernel:
    """Load a cubin built elsewhere (a builder process) as a CudaKernel of `func` (its body may be empty)."""
    import json

    from ..ir.hlo import DType
    from ..schedule_space.loop_ir import BufferDecl
    from .cuda import Launch
    d = json.loads(artifact)
    launches = tuple(Launch(n, tuple(g), tuple(b), sb, db, tuple(p)) for n, g, b, sb, db, p in d["launches"])
    temps = tuple(BufferDecl(n, tuple(s), DType(dt), "global") for n, s, dt in d["temps"])
    return CudaKernel(func, CudaSource(func, "", launches, temps, d["index_bits"]), cubin, target, compile_seconds)


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
        src = generate_cuda(func, t.arch)
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


__all__ = ["build_cuda", "CudaKernel", "LaunchProgram", "compile_cubin", "detect_cuda_target", "nvcc_version",
           "time_launches", "DeviceArray", "device_pointer", "empty_device", "to_device", "as_device", "synchronize",
           "source_artifact", "kernel_from_artifact"]
