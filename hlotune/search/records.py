"""Measurement results -> tuning database records (the search layer joins `measure` and `database`).

Map:
  to_record(inp, res) -> Record    one MeasureInput and its MeasureResult as a self-describing record
                                   (workload JSON, target fingerprint and family, schedule JSON and key)
"""

from __future__ import annotations

import json

from ..database.record import Record
from ..ir.workload import workload_to_json
from ..measure.records import MeasureInput, MeasureResult
from ..schedule_space.steps import schedule_to_json


def to_record(inp: MeasureInput, res: MeasureResult) -> Record:
    """The database record of measuring `inp` (costs only when valid; the error kind's value otherwise)."""
    task, sched = inp.task, inp.schedule
    return Record(
        workload_key=task.key,
        workload=workload_to_json(task.compute),
        target=task.target.fingerprint,
        target_family=task.target.family,
        steps=json.dumps(schedule_to_json(sched), separators=(",", ":")),
        schedule_key=sched.key,
        costs=tuple(res.costs) if res.valid else (),
        error_kind=res.error_kind.value,
        error_msg=res.error_msg,
        build_s=res.build_s,
        run_s=res.run_s,
        timestamp=res.timestamp,
    )
