"""Re-measure stored tuning records (`hlotune db verify`): the `recheck(record)` callback.

Map:
  Rechecker(measurer, target)    callable: record -> (ok, new_costs); raises with the error kind and
                                 message when the schedule no longer builds, runs or gives the right answer
  make_recheck(...)              a Rechecker with its own measurer (close it when done)

A record is read by duck typing (`workload_key`, `workload` JSON, `steps` JSON), so this layer does
not import the database.  The schedule is rebuilt from the record's own workload and re-checked
against the reference on fresh random inputs, on this machine (the host target): comparing the new
median with the stored one shows drift (a different machine, compiler or load).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import HlotuneError
from ..ir.workload import workload_from_json
from ..schedule_space.steps import schedule_from_json
from ..schedule_space.task import Task
from ..target import Target
from .measurer import ProgramMeasurer
from .records import MeasureInput
from .runner import LocalRunner, TimingConfig


class Rechecker:
    """`recheck(record) -> (ok, costs)` for `database.verify` (see the module docstring)."""

    def __init__(self, measurer: ProgramMeasurer | None = None, target: Target | None = None):
        self.measurer = measurer or ProgramMeasurer()
        self.target = target or Target.host_cpu()

    def measure_input(self, record: Any) -> MeasureInput:
        if not record.workload:
            raise HlotuneError(f"record of {record.workload_key} has no workload (compute definition)")
        cd = workload_from_json(record.workload)
        try:
            sched = schedule_from_json(json.loads(record.steps))
        except json.JSONDecodeError as e:
            raise HlotuneError(f"record of {record.workload_key}: steps are not JSON ({e})") from None
        return MeasureInput(Task(record.workload_key, cd, self.target, name=cd.name), sched)

    def __call__(self, record: Any) -> tuple[bool, tuple[float, ...]]:
        res = self.measurer.measure_batch([self.measure_input(record)])[0]
        if not res.valid:
            raise HlotuneError(f"{res.error_kind.value}: {res.error_msg}")
        return True, res.costs

    def close(self) -> None:
        self.measurer.close()

    def __enter__(self) -> Rechecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_recheck(timing: TimingConfig | None = None, timeout: float = 10.0) -> Rechecker:
    """A Rechecker with a fresh measurer (one builder per core, one runner)."""
    return Rechecker(ProgramMeasurer(runner=LocalRunner(timing, timeout=timeout)))
