"""The interface every tuning database backend implements, with generic query code.

Map:
- `BestMatch`: (record, matched) where matched is "exact" (same target fingerprint) or "family".
- `SummaryRow`: per (workload key, target): record count, valid count, best median, error counts.
- `Database`: abstract base. Backends implement `add_many`, `records`, `close`; the queries
  (`best`, `top_k`, `has`, `count`, `summary`, ...) have generic versions here built on `records()`,
  which the SQL backends override with indexed queries.

Best = the lowest median cost among valid records (error kind "none") of (workload key, target);
ties go to the record stored first.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from .record import Record


class BestMatch(NamedTuple):
    """The best record found and how it matched the asked target: "exact" or "family"."""

    record: Record
    matched: Literal["exact", "family"]


@dataclass(frozen=True)
class SummaryRow:
    """What a database holds for one (workload key, target)."""

    workload_key: str
    target: str
    target_family: str
    records: int
    valid: int
    best_median_s: float | None
    errors: tuple[tuple[str, int], ...] = field(default=())

    def to_dict(self) -> dict:
        return {"workload_key": self.workload_key, "target": self.target, "target_family": self.target_family,
                "records": self.records, "valid": self.valid, "best_median_s": self.best_median_s,
                "errors": dict(self.errors)}



class Database(abc.ABC):
    """A tuning database: append records, query the best ones.

    Use as a context manager or call `close()`. `location` names the file or URL (for messages;
    passwords hidden).
    """

    location: str = "<database>"

    # -- what a backend implements -------------------------------------------------------------
    @abc.abstractmethod
    def add_many(self, records: Iterable[Record]) -> int:
        """Store records (one transaction where the backend has them); returns how many were new.

        A record whose uid is already stored is skipped (stored once).
        """

    @abc.abstractmethod
    def records(self, workload_key: str | None = None, target: str | None = None,
                target_family: str | None = None) -> Iterator[Record]:
        """All records (filtered when given), in the order they were stored."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release files and connections."""

    # -- generic queries -----------------------------------------------------------------------
    def add(self, record: Record) -> bool:
        """Store one record; False when the same record (same uid) was already there."""
        return self.add_many([record]) == 1

    def best(self, workload_key: str, target: str, family: str | None = None) -> BestMatch | None:
        """The best valid record for (workload key, target fingerprint).

        Falls back to records of the same target family when there are none for the exact
        fingerprint and `family` is given; `matched` says which. None when there is nothing valid.
        """
        top = self.top_k(workload_key, target, 1)
        if top:
            return BestMatch(top[0], "exact")
        if family:
            top = self._top_family(workload_key, family, 1)
            if top:
                return BestMatch(top[0], "family")
        return None

    def top_k(self, workload_key: str, target: str, k: int, family: str | None = None) -> list[Record]:
        """Up to k best valid records, lowest median first, one per schedule key (for warm starts).

        With `family`, records of the same target family are used when the exact target has none.
        """
        out = self._top(self.records(workload_key, target=target), k)
        if not out and family:
            out = self._top_family(workload_key, family, k)
        return out

    def _top_family(self, workload_key: str, family: str, k: int) -> list[Record]:
        return self._top(self.records(workload_key, target_family=family), k)

    @staticmethod
    def _top(records: Iterable[Record], k: int) -> list[Record]:
        best: dict[str, tuple[float, int, Record]] = {}
        for i, r in enumerate(records):
            if r.valid:
                cur = best.get(r.schedule_key)
                if cur is None or r.median < cur[0]:  # type: ignore[operator]
                    best[r.schedule_key] = (r.median, i, r)  # type: ignore[assignment]
        return [t[2] for t in sorted(best.values(), key=lambda t: (t[0], t[1]))[:max(k, 0)]]

    def has(self, schedule_key: str, target: str) -> bool:
        """True when a record (valid or not) of this schedule on this exact target exists."""
        return any(r.schedule_key == schedule_key for r in self.records(target=target))

    def schedule_keys(self, workload_key: str | None = None, target: str | None = None) -> set[str]:
        """The schedule keys already recorded (for dedupe of a whole batch at once)."""
        return {r.schedule_key for r in self.records(workload_key, target)}

    def count(self, workload_key: str | None = None, target: str | None = None, valid_only: bool = False) -> int:
        """How many records (of a workload / target; only valid ones when asked)."""
        return sum(1 for r in self.records(workload_key, target) if r.valid or not valid_only)

    def workload(self, workload_key: str) -> str | None:
        """The serialized workload (compute definition) stored under `workload_key`, if any."""
        for r in self.records(workload_key):
            if r.workload:
                return r.workload
        return None

    def summary(self) -> list[SummaryRow]:
        """One row per (workload key, target), sorted by workload key then target."""
        acc: dict[tuple[str, str], list] = {}
        for r in self.records():
            a = acc.setdefault((r.workload_key, r.target), [r.target_family, 0, 0, None, Counter()])
            a[1] += 1
            if r.valid:
                a[2] += 1
                a[3] = r.median if a[3] is None else min(a[3], r.median)
            else:
                a[4][r.error_kind] += 1
        return [SummaryRow(wk, t, a[0], a[1], a[2], a[3], tuple(sorted(a[4].items())))
                for (wk, t), a in sorted(acc.items())]

    def bests(self, workload_key: str | None = None, target: str | None = None) -> list[BestMatch]:
        """The best record of every (workload key, target) pair present (filtered when given)."""
        out = []
        for row in self.summary():
            if (workload_key and row.workload_key != workload_key) or (target and row.target != target):
                continue
            m = self.best(row.workload_key, row.target)
            if m is not None:
                out.append(m)
        return out

    # -- conveniences --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Record]:
        return self.records()

    def __len__(self) -> int:
        return self.count()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"
