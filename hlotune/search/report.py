"""`hlotune report DB`: what a tuning database says about a tuning run, per subgraph and for the whole model.

Map:
  build_report(db, model=None, target=None) -> DbReport   curves and summaries from the stored records
  DbReport.text() / .to_json() / .plot(path)              table; JSON; best latency against trials and time
  WorkloadCurve                                           one workload: running best per trial, default, errors
  default_keys(compute, workload_key)                     schedule keys a default-schedule record can have

Per workload: records in stored order (trial 1, 2, ...), the running best latency after each and the time
since the first record of the database (earlier runs included, pauses between runs included), the default
schedule's measured latency (its record is recognized by its sketch id or its steps), the speedup of the best
over it, and the error kinds.  The whole model: at each trial of any workload, the sum over workloads of
weight x (best so far, else default); weights come from `model` (a MODEL given with --model) or are 1.
The plot needs matplotlib (the `search` extra); without it `plot` raises InputError saying so.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from .progress import fmt_latency
from .space import DEFAULT_SKETCH


@dataclass
class WorkloadCurve:
    key: str
    name: str
    weight: int = 1
    trials: list[int] = field(default_factory=list)          # global trial index of each trial (a schedule)
    times: list[float] = field(default_factory=list)         # seconds since the first record
    best: list[float] = field(default_factory=list)          # running best (inf until a valid one)
    default_s: float | None = None
    errors: Counter = field(default_factory=Counter)
    n: int = 0
    valid: int = 0

    @property
    def best_s(self) -> float | None:
        return self.best[-1] if self.best and math.isfinite(self.best[-1]) else None

    @property
    def speedup(self) -> float | None:
        b = self.best_s
        return self.default_s / b if b and self.default_s else None

    def trials_to(self, fraction: float = 0.9) -> int | None:
        """Trials (of this workload) until the best was within 1/fraction of the final best."""
        b = self.best_s
        if b is None:
            return None
        for k, v in enumerate(self.best):
            if v <= b / fraction:
                return k + 1
        return None


@dataclass
class DbReport:
    location: str
    target: str
    curves: list[WorkloadCurve]
    model_trials: list[int] = field(default_factory=list)
    model_times: list[float] = field(default_factory=list)
    model_latency: list[float] = field(default_factory=list)
    model_name: str = ""

    @property
    def default_latency_s(self) -> float | None:
        if not self.curves or any(c.default_s is None for c in self.curves):
            return None
        return sum(c.weight * c.default_s for c in self.curves)

    @property
    def model_latency_s(self) -> float | None:
        return self.model_latency[-1] if self.model_latency else None

    def to_json(self) -> dict:
        return {"database": self.location, "target": self.target, "model": self.model_name,
                "model_latency_s": self.model_latency_s, "default_latency_s": self.default_latency_s,
                "workloads": [{"key": c.key, "name": c.name, "weight": c.weight, "records": c.n, "valid": c.valid,
                               "best_s": c.best_s, "default_s": c.default_s, "speedup": c.speedup,
                               "trials_to_90pct": c.trials_to(0.9), "errors": dict(c.errors)} for c in self.curves]}

    def text(self) -> str:
        lines = [f"{self.location}: target {self.target}" + (f", model {self.model_name}" if self.model_name else "")]
        lines.append(f"  {'subgraph':28s} {'weight':>6s} {'records':>7s} {'valid':>5s} {'default':>11s} "
                     f"{'best':>11s} {'speedup':>8s} {'90% at':>7s}  errors")
        for c in self.curves:
            sp = f"{c.speedup:.2f}x" if c.speedup else "-"
            at = c.trials_to(0.9)
            errs = ", ".join(f"{k} {v}" for k, v in sorted(c.errors.items())) or "-"
            note = "  (no valid schedule: uses the default)" if c.best_s is None else ""
            lines.append(f"  {c.name[:28]:28s} {c.weight:6d} {c.n:7d} {c.valid:5d} {fmt_latency(c.default_s):>11s} "
                         f"{fmt_latency(c.best_s):>11s} {sp:>8s} {at if at else '-':>7}  {errs}{note}")
        m, d = self.model_latency_s, self.default_latency_s
        sp = f"{d / m:.2f}x" if m and d else "-"
        total = sum(c.n for c in self.curves)
        lines.append(f"  whole model (sum of weight x latency): {fmt_latency(m)}, default schedules "
                     f"{fmt_latency(d)}, speedup {sp}; {total} trials")
        return "\n".join(lines)

    def plot(self, path: str) -> None:
        """Best latency against trials and against time: per subgraph (top) and the whole model (bottom)."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise InputError("--plot needs matplotlib: pip install 'hlotune[search]' (or pip install matplotlib)") \
                from None
        fig, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
        for c in self.curves:
            pts = [(t, tm, b) for t, tm, b in zip(range(1, len(c.best) + 1), c.times, c.best) if math.isfinite(b)]
            if not pts:
                continue
            axes[0][0].step([p[0] for p in pts], [p[2] * 1e3 for p in pts], where="post", label=c.name[:30])
            axes[0][1].step([p[1] for p in pts], [p[2] * 1e3 for p in pts], where="post", label=c.name[:30])
        axes[0][0].set(xlabel="trials of the subgraph", ylabel="best latency (ms)", yscale="log",
                       title="per subgraph")
        axes[0][1].set(xlabel="time (s)", ylabel="best latency (ms)", yscale="log", title="per subgraph")
        if len(self.curves) <= 12:
            axes[0][0].legend(fontsize=7)
        ms = [v * 1e3 for v in self.model_latency]
        axes[1][0].step(self.model_trials, ms, where="post", color="k")
        axes[1][1].step(self.model_times, ms, where="post", color="k")
        d = self.default_latency_s
        for ax in axes[1]:
            if d:
                ax.axhline(d * 1e3, ls="--", color="gray", label="default schedules")
                ax.legend(fontsize=7)
        axes[1][0].set(xlabel="trials (all subgraphs)", ylabel="estimated model latency (ms)", title="whole model")
        axes[1][1].set(xlabel="time (s)", ylabel="estimated model latency (ms)", title="whole model")
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=100)
        except OSError as e:
            raise InputError(f"cannot write the plot to {path}: {e.strerror or e}") from None
        finally:
            plt.close(fig)


def default_keys(compute, workload_key: str, target=None) -> set[str]:
    """The schedule keys of the default schedule of a workload (with and without the default sketch id)."""
    from ..schedule_space.default import default_schedule
    from ..schedule_space.steps import Schedule
    from ..target import Target

    try:
        steps = tuple(default_schedule(compute, target or Target.host_cpu()))
    except Exception:  # a workload the default rule cannot schedule: no default record can be recognized
        return set()
    return {Schedule(workload_key, steps, DEFAULT_SKETCH).key, Schedule(workload_key, steps).key}


def _is_default(rec, keys: set[str]) -> bool:
    if rec.schedule_key in keys:
        return True
    try:
        d = json.loads(rec.steps)
    except ValueError:
        return False
    return isinstance(d, dict) and d.get("sketch") == DEFAULT_SKETCH


def _names_weights(model) -> tuple[dict[str, str], dict[str, int], list[str], str]:
    if model is None:
        return {}, {}, [], ""
    from ..schedule_space.task import tasks_from_subgraphs
    from ..target import Target

    tasks = tasks_from_subgraphs(model.frontend.subgraphs, Target.host_cpu())
    return ({t.key: t.name for t in tasks}, {t.key: t.weight for t in tasks}, [t.key for t in tasks], model.name)


def _model_latency(curves) -> float:
    """Sum of weight x (best so far, else default) latency; inf while some workload has neither."""
    return sum(c.weight * (c.best[-1] if c.best and math.isfinite(c.best[-1]) else (c.default_s or math.inf))
               for c in curves)


def build_report(db, model: Any = None, target: str | None = None) -> DbReport:
    """Curves and summaries of the records in `db` (one target: `target`, else the one with most records).
    With `model` (an api.Model), only its workloads, named and weighted as in the model."""
    from ..ir.workload import workload_from_json

    names, weights, order, model_name = _names_weights(model)
    recs = list(db.records(target=target)) if target else list(db.records())
    if not target and recs:
        target = Counter(r.target for r in recs).most_common(1)[0][0]
        recs = [r for r in recs if r.target == target]
    if order:
        recs = [r for r in recs if r.workload_key in weights]
    if not recs:
        where = (f" for target {target}" if target else "") + (f" of model {model_name}" if model_name else "")
        raise InputError(f"{getattr(db, 'location', 'the database')} has no records{where}")
    t0 = min(r.timestamp for r in recs)
    curves: dict[str, WorkloadCurve] = {}
    dkeys: dict[str, set[str]] = {}
    for k in order:
        curves[k] = WorkloadCurve(k, names.get(k, k), weights.get(k, 1))
    m_trials, m_times, m_lat = [], [], []
    seen: set[tuple[str, str]] = set()
    n = 0
    for r in recs:
        c = curves.get(r.workload_key)
        again = (r.workload_key, r.schedule_key) in seen   # a confirmation timing: no new trial
        if again:
            if r.valid and r.median is not None and c.best and r.median < c.best[-1]:
                c.best[-1] = r.median
                if m_lat:   # the model's latency at the last trial moves with it
                    m_lat[-1] = _model_latency(curves.values())
            continue
        seen.add((r.workload_key, r.schedule_key))
        n += 1
        if c is None:
            c = curves[r.workload_key] = WorkloadCurve(r.workload_key, names.get(r.workload_key, r.workload_key))
        if r.workload_key not in dkeys:
            try:
                dkeys[r.workload_key] = default_keys(workload_from_json(r.workload), r.workload_key) \
                    if r.workload else set()
            except Exception:  # an unreadable workload: defaults recognized by sketch id only
                dkeys[r.workload_key] = set()
        c.n += 1
        prev = c.best[-1] if c.best else math.inf
        if r.valid and r.median is not None:
            c.valid += 1
            prev = min(prev, r.median)
            if c.default_s is None and _is_default(r, dkeys[r.workload_key]):
                c.default_s = r.median
        else:
            c.errors[r.error_kind] += 1
        c.best.append(prev)
        c.trials.append(n)
        c.times.append(r.timestamp - t0)
        lat = _model_latency(curves.values())
        if math.isfinite(lat):
            m_trials.append(n)
            m_times.append(r.timestamp - t0)
            m_lat.append(lat)
    return DbReport(getattr(db, "location", ""), target or "", list(curves.values()), m_trials, m_times, m_lat,
                    model_name)


__all__ = ["build_report", "DbReport", "WorkloadCurve", "default_keys"]
