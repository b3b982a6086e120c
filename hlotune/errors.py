"""The user-facing error hierarchy.

Every error hlotune raises on bad input derives from `HlotuneError`; the CLI prints
`str(err)` on one line and exits 2.  Errors carry where they happened (file, line,
column, instruction) so the message can name it.
"""

from __future__ import annotations


class HlotuneError(Exception):
    """Base class of every error hlotune reports to a user."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None, op: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.op = op
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.line is not None:
            where.append(f"line {self.line}" + (f", column {self.column}" if self.column is not None else ""))
        if self.op:
            where.append(f"at {self.op}")
        return (": ".join([", ".join(where), self.message]) if where else self.message)

    def with_file(self, file: str) -> HlotuneError:
        """Return the same error with the file name filled in (for errors raised on text)."""
        if self.file is None:
            self.file = file
            self.args = (self._format(),)
        return self


class ParseError(HlotuneError):
    """Malformed HLO text: names the line, column and offending token."""


class UnsupportedError(HlotuneError):
    """Well-formed input that uses an opcode, dtype or attribute hlotune does not support."""


class ShapeError(HlotuneError):
    """A well-formed module whose shapes do not agree; names the instruction."""


class InputError(HlotuneError):
    """Wrong arguments given to a compiled model or a command (shape, dtype, count, file)."""


class ScheduleError(HlotuneError):
    """A schedule step that cannot be applied to the current state, with the reason."""


class CompileError(HlotuneError):
    """Code generation or LLVM/nvcc failed; names the stage and step when known."""


class DatabaseError(HlotuneError):
    """A tuning database that cannot be opened, read or written."""


class ConfigError(HlotuneError):
    """A setting (environment variable or option) with an invalid value."""
