"""The progress display of `hlotune tune`: a bar with ETA and the estimated whole-model latency, and one
line per subgraph whenever its best latency improves.

Map:
  Progress(total_trials, time_budget, stream, enabled)
    .start(trials, elapsed)     where a resumed run starts (its ETA counts only this run's speed)
    .update(trials, elapsed, model_s, default_s, note)   redraw the bar
    .line(text)                 a line above the bar (a subgraph improved, a task stopped)
    .close()
  fmt_time(seconds) / fmt_latency(seconds)

On a terminal the bar is redrawn in place (carriage return); otherwise each update is one line.
"""

from __future__ import annotations

import math
import sys
from typing import TextIO


def fmt_time(s: float) -> str:
    """h:mm:ss (or m:ss)."""
    if not math.isfinite(s):
        return "?"
    s = int(round(max(0.0, s)))
    h, r = divmod(s, 3600)
    m, sec = divmod(r, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def fmt_latency(s: float | None) -> str:
    """A latency in us / ms / s."""
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.3f} ms"
    return f"{s:.3f} s"


class Progress:
    """Progress bar with ETA (see the module docstring)."""

    WIDTH = 24

    def __init__(self, total_trials: int | None, time_budget: float | None, stream: TextIO | None = None,
                 enabled: bool = True):
        self.total = total_trials
        self.budget = time_budget
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.f0 = 0.0
        self.e0 = 0.0
        self._drawn = False

    def fraction(self, trials: int, elapsed: float) -> float:
        f = 0.0
        if self.total:
            f = max(f, trials / self.total)
        if self.budget:
            f = max(f, elapsed / self.budget)
        return min(1.0, f)

    def start(self, trials: int, elapsed: float) -> None:
        self.f0 = self.fraction(trials, elapsed)
        self.e0 = elapsed

    def eta(self, trials: int, elapsed: float) -> float:
        f = self.fraction(trials, elapsed)
        run = elapsed - self.e0
        if f <= self.f0 or run <= 0:
            return math.inf
        return run / (f - self.f0) * (1.0 - f)

    def update(self, trials: int, elapsed: float, model_s: float | None = None, default_s: float | None = None,
               note: str = "") -> str:
        f = self.fraction(trials, elapsed)
        n = int(round(f * self.WIDTH))
        total = f"/{self.total}" if self.total else ""
        speed = ""
        if model_s and default_s and math.isfinite(model_s) and math.isfinite(default_s):
            speed = f" ({default_s / model_s:.2f}x over default)"
        text = (f"[{'#' * n}{'.' * (self.WIDTH - n)}] {f * 100:3.0f}%  {trials}{total} trials  "
                f"{fmt_time(elapsed)} elapsed  ETA {fmt_time(self.eta(trials, elapsed))}  "
                f"model {fmt_latency(model_s)}{speed}" + (f"  {note}" if note else ""))
        if self.enabled:
            if self.tty:
                self.stream.write("\r\x1b[2K" + text)
                self._drawn = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        return text

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


__all__ = ["Progress", "fmt_time", "fmt_latency"]
