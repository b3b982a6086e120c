"""One tuning record: a measured (or failed) schedule of one workload on one target.

Map:
- `ERROR_KINDS`: the closed set of error kinds a measurement can end with ("none" = valid).
- `Record`: frozen dataclass; `median`, `valid`, `uid` (record identity, for dedupe on merge).
- `Record.to_dict` / `Record.from_dict` / `to_json_line` / `from_json_line`: the exchange form
  (one JSON object per record; what JSONL files hold and `db export` writes).
- `SCHEMA_VERSION`: the version of the stored form, shared by every backend.

The workload (serialized compute definition) and the schedule steps are opaque JSON strings here:
the database stores them, it does not interpret them.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..errors import DatabaseError

SCHEMA_VERSION = 1

ERROR_KINDS = ("none", "instantiation", "compile", "runtime", "wrong_answer", "build_timeout", "run_timeout",
               "unknown")

_FIELDS = ("workload_key", "workload", "target", "target_family", "steps", "schedule_key", "costs",
           "error_kind", "error_msg", "build_s", "run_s", "timestamp", "version")


@lru_cache(maxsize=1)
def hlotune_version() -> str:
    """The installed hlotune version (stored in every record)."""
    try:
        from importlib.metadata import version
        return version("hlotune")
    except Exception:  # not installed (running from a source tree)
        return "unknown"


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Record:
    """A measurement of one schedule of one workload on one target.

    `costs` are seconds, one per repeat (empty when the candidate failed). `error_kind` is one of
    `ERROR_KINDS`; a record is valid when it is "none" (and then has at least one cost).
    """

    workload_key: str
    workload: str
    target: str
    target_family: str
    steps: str
    schedule_key: str
    costs: tuple[float, ...] = ()
    error_kind: str = "none"
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = field(default_factory=_now)
    version: str = field(default_factory=hlotune_version)

    def __post_init__(self) -> None:
        for name in ("workload_key", "workload", "target", "target_family", "steps", "schedule_key",
                     "error_msg", "version"):
            if not isinstance(getattr(self, name), str):
                raise DatabaseError(f"record field {name!r} must be a string, got {type(getattr(self, name)).__name__}")
        for name in ("workload_key", "target", "schedule_key"):
            if not getattr(self, name):
                raise DatabaseError(f"record field {name!r} is empty")
        if self.error_kind not in ERROR_KINDS:
            raise DatabaseError(f"unknown error kind {self.error_kind!r} (one of {', '.join(ERROR_KINDS)})")
        try:
            costs = tuple(float(c) for c in self.costs)
            nums = {n: float(getattr(self, n)) for n in ("build_s", "run_s", "timestamp")}
        except (TypeError, ValueError) as e:
            raise DatabaseError(f"record costs and times must be numbers: {e}") from None
        if any(not math.isfinite(c) or c < 0 for c in costs):
            raise DatabaseError(f"record costs must be finite and non-negative seconds, got {list(costs)}")
        if self.error_kind == "none" and not costs:
            raise DatabaseError("a valid record (error kind 'none') needs at least one cost")
        if any(not math.isfinite(v) for v in nums.values()):
            raise DatabaseError(f"record times must be finite, got {nums}")
        object.__setattr__(self, "costs", costs)
        for n, v in nums.items():
            object.__setattr__(self, n, v)

    @property
    def valid(self) -> bool:
        """True when the measurement succeeded (error kind "none")."""
        return self.error_kind == "none"

    @property
    def median(self) -> float | None:
        """Median cost in seconds, or None when there are no costs."""
        return statistics.median(self.costs) if self.costs else None

    @property
    def uid(self) -> str:
        """Record identity: workload key, target, schedule key, timestamp and costs (hex digest).

        Two records with the same uid are the same measurement; databases store it once.
        """
        ident = json.dumps([self.workload_key, self.target, self.schedule_key, repr(self.timestamp),
                            [repr(c) for c in self.costs]], separators=(",", ":"))
        return hashlib.sha256(ident.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        """The exchange form (JSON-serializable), with the schema version."""
        d: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for name in _FIELDS:
            v = getattr(self, name)
            d[name] = list(v) if name == "costs" else v
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        """Build a record from its exchange form; DatabaseError on a malformed or newer one."""
        if not isinstance(d, dict):
            raise DatabaseError(f"a record must be a JSON object, got {type(d).__name__}")
        schema = d.get("schema", SCHEMA_VERSION)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION or schema < 1:
            raise NewerSchemaError(f"record schema version {schema!r} is not supported "
                                   f"(this hlotune reads versions 1 to {SCHEMA_VERSION})")
        missing = [n for n in ("workload_key", "target", "schedule_key", "steps") if n not in d]
        if missing:
            raise DatabaseError(f"record lacks field(s) {', '.join(missing)}")
        kw = {n: d[n] for n in _FIELDS if n in d}
        kw.setdefault("workload", "")
        kw.setdefault("target_family", "")
        if not isinstance(kw.get("costs", []), list):
            raise DatabaseError("record field 'costs' must be a list of numbers")
        kw["costs"] = tuple(kw.get("costs", ()))
        return cls(**kw)

    def to_json_line(self) -> str:
        """One line of JSON (no newline), keys in a fixed order."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json_line(cls, line: str) -> Record:
        """Parse one JSONL line; DatabaseError with the reason when it is not a record."""
        try:
            d = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatabaseError(f"not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
        return cls.from_dict(d)


class NewerSchemaError(DatabaseError):
    """Data written by a newer hlotune (an unknown, higher schema version)."""
