"""hlotune: an auto-scheduling tensor compiler for XLA HLO.

    import hlotune
    exe = hlotune.compile("model.hlo")            # default schedules
    outs = exe(x, w)                              # numpy in, tuple of numpy out
    m = hlotune.load_model("model.hlo")           # parsed + verified module, fused subgraphs

Errors on bad input are subclasses of `hlotune.HlotuneError`.
"""

from .api import Model, compile, inspect_model, load_model, reference_run, tune
from .errors import (
    CompileError,
    ConfigError,
    DatabaseError,
    HlotuneError,
    InputError,
    ParseError,
    ScheduleError,
    ShapeError,
    UnsupportedError,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "TuneReport":   # the result of `tune`; imported on first use (the search layer is heavier)
        from .search.tuner import TuneReport
        return TuneReport
    raise AttributeError(f"module 'hlotune' has no attribute {name!r}")

__all__ = [
    "Model", "compile", "inspect_model", "load_model", "reference_run", "tune", "TuneReport", "__version__",
    "HlotuneError", "ParseError", "UnsupportedError", "ShapeError", "InputError", "ScheduleError",
    "CompileError", "DatabaseError", "ConfigError",
]
