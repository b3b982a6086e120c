"""GPU tier: every test here is skipped, with the reason shown, where no CUDA device is usable."""

import pytest


def _gpu_reason() -> str | None:
    try:
        import pycuda.driver as drv  # noqa: F401
    except Exception as e:  # ImportError, or pycuda present but no CUDA library
        return f"pycuda not usable: {e}"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device"
    except Exception as e:
        return f"no CUDA driver/device: {e}"
    return None


_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"GPU tier skipped: {_REASON}")
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(skip)
