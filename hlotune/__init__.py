"""hlotune: an auto-scheduling tensor compiler for XLA HLO.

    import hlotune
    exe = hlotune.compile("model.hlo")            # default schedules
    outs = exe(x, w)                              # numpy in, tuple of numpy out
    m = hlotune.load_model("model.hlo")           # parsed + verified module, fused subgraphs

Errors on bad input are subclasses of `hlotune.HlotuneError`.
"""

from .api import Model, compile, inspect_model, load_model, reference_run
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

__all__ = [
    "Model", "compile", "inspect_model", "load_model", "reference_run", "__version__",
    "HlotuneError", "ParseError", "UnsupportedError", "ShapeError", "InputError", "ScheduleError",
    "CompileError", "DatabaseError", "ConfigError",
]
