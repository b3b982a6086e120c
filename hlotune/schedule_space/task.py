"""A tuning task: one distinct workload (compute definition) on one target.

Map:
  Task                 workload key, compute definition, target, weight (occurrences), name, flops
  tasks_from_subgraphs  the distinct workloads of a model's fused subgraphs, as tasks
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import ComputeDef
from ..target import Target


@dataclass(frozen=True)
class Task:
    """What the search tunes and the measurer times: one workload on one target."""

    key: str
    compute: ComputeDef
    target: Target
    weight: int = 1
    name: str = ""
    flops: float = 0.0

    def __str__(self) -> str:
        return f"{self.name or self.compute.name} ({self.key}, weight {self.weight})"


def tasks_from_subgraphs(subgraphs, target: Target) -> list[Task]:
    """One task per distinct workload key, in first-appearance order (weight = occurrences)."""
    seen: dict[str, Task] = {}
    for sg in subgraphs:
        wl = sg.workload
        if wl.key not in seen:
            seen[wl.key] = Task(wl.key, wl.compute, target, wl.weight, sg.name, float(wl.flops))
    return list(seen.values())
