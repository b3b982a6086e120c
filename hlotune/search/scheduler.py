"""Task scheduler: which subgraph gets the next round of measurements (Ansor's gradient scheduler).

Map:
  TaskState                 per task: trials, best latency (s), best after each round, rounds without
                            improvement, dead (early stopped / space exhausted)
  TaskScheduler(weights, flops, tags, ...)
    .next_task(rng) -> int | None     warm-up round robin, then the most negative gradient (eps-greedy)
    .update(i, trials, best)          after a round of task i
    .kill(i, why)                     stop tuning task i
    .objective() -> float             sum over tasks of weight x best latency (the default's when untuned)
    .gradients() -> list[float]

The objective is f = sum_i w_i g_i, g_i the best latency of task i.  The gradient of f with respect to the
trials given to task i (Ansor's formula):
    w_i * (alpha * backward_i + (1 - alpha) * forward_i)
  backward_i = (g_i(t_i) - g_i(t_i - window rounds)) / trials in those rounds      (recent progress)
  forward_i  = min(g_i - g_i / t_i * ..., beta * C_i / best throughput of similar tasks) - g_i
             i.e. the next trial may improve by g_i / t_i, and a task far below the throughput (FLOP/s)
             of the tasks with its tag (same sketch rules) can gain up to the gap.
The task with the most negative gradient gets the round; with probability eps_random a random live one.
A task stops when `early_stopping` trials passed without improving it (per-subgraph early stopping) or its
policy has nothing new to propose.  Every task gets one round first (warm-up), except tasks that already
have trials (a resumed run).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass
class TaskState:
    trials: int = 0
    best: float = math.inf
    history: list[tuple[int, float]] = field(default_factory=list)   # (trials, best) after each round
    last_improved_at: int = 0
    dead: str = ""
    rounds: int = 0


class TaskScheduler:
    """Allocates rounds of measurements among tasks (see the module docstring)."""

    def __init__(self, weights, flops, tags, alpha: float = 0.2, beta: float = 2.0, window: int = 3,
                 eps_random: float = 0.05, early_stopping: int | None = None, defaults=None):
        self.weights = [float(w) for w in weights]
        self.flops = [float(f) for f in flops]
        self.tags = list(tags)
        self.alpha, self.beta, self.window = alpha, beta, window
        self.eps_random = eps_random
        self.early_stopping = early_stopping
        self.defaults = list(defaults) if defaults is not None else [math.inf] * len(self.weights)
        self.states = [TaskState() for _ in self.weights]

    # ------------------------------------------------------------------ state
    def restore(self, i: int, trials: int, best: float) -> None:
        """Start task i from what a database already holds (a resumed run)."""
        st = self.states[i]
        st.trials, st.best = trials, best
        st.last_improved_at = trials
        if trials:
            st.history.append((trials, best))
            st.rounds = 1

    def update(self, i: int, trials: int, best: float) -> None:
        """Task i had a round of `trials` more measurements; `best` is its best latency now."""
        st = self.states[i]
        st.trials += trials
        st.rounds += 1
        if best < st.best * (1 - 1e-9):
            st.last_improved_at = st.trials
        st.best = min(st.best, best)
        st.history.append((st.trials, st.best))
        if self.early_stopping and st.trials - st.last_improved_at >= self.early_stopping:
            self.kill(i, f"no improvement in {self.early_stopping} trials")

    def kill(self, i: int, why: str) -> None:
        self.states[i].dead = why or "stopped"

    def live(self) -> list[int]:
        return [i for i, s in enumerate(self.states) if not s.dead]

    def latency(self, i: int) -> float:
        """The latency task i contributes: its best, else its default's."""
        b = self.states[i].best
        return b if math.isfinite(b) else self.defaults[i]

    def objective(self) -> float:
        return sum(w * self.latency(i) for i, w in enumerate(self.weights))

    # ------------------------------------------------------------------ gradient
    def _gradient(self, i: int) -> float:
        st = self.states[i]
        g = st.best
        if not math.isfinite(g):
            return -math.inf   # nothing valid yet: most urgent
        backward = 0.0
        if len(st.history) > self.window:
            (t0, g0), (t1, g1) = st.history[-1 - self.window], st.history[-1]
            backward = (g1 - g0) / max(1, t1 - t0)
        g_next = g - g / max(1, st.trials)
        similar = [j for j, t in enumerate(self.tags) if t == self.tags[i] and math.isfinite(self.states[j].best)]
        if len(similar) > 1 and self.flops[i] > 0:
            best_flops = max(self.flops[j] / self.states[j].best for j in similar)
            if best_flops > 0:
                g_next = min(g_next, self.beta * self.flops[i] / best_flops)
        forward = g_next - g
        return self.weights[i] * (self.alpha * backward + (1 - self.alpha) * forward)

    def gradients(self) -> list[float]:
        return [self._gradient(i) if not s.dead else 0.0 for i, s in enumerate(self.states)]

    def next_task(self, rng: random.Random) -> int | None:
        """The task for the next round, or None when every task has stopped."""
        live = self.live()
        if not live:
            return None
        fresh = [i for i in live if self.states[i].rounds == 0]
        if fresh:
            return fresh[0]
        if rng.random() < self.eps_random:
            return live[rng.randrange(len(live))]
        grads = {i: self._gradient(i) for i in live}
        return min(live, key=lambda i: (grads[i], i))


__all__ = ["TaskScheduler", "TaskState"]
