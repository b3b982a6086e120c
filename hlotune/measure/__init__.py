"""Measurement: build candidates in worker processes, run them isolated, check and time them.

Modules: `records` (MeasureInput, BuildResult, MeasureResult, ErrorKind), `reference` (inputs and
reference outputs per task, the output check), `workers` (processes), `builder` (LocalBuilder),
`runner` (LocalRunner, TimingConfig), `measurer` (ProgramMeasurer, FaultHook), `recheck` (db verify).
"""
