"""`make demo` end to end at the test size with a few seconds of tuning: the default and the tuned executables
agree with JAX's outputs and the reference interpreter, and the demo prints both times and the speedup."""

import re

from hlotune import demo


def test_demo_runs_and_checks(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HLOTUNE_LOG_DIR", str(tmp_path / "logs"))   # the run log: not into the checkout's logs/
    log = tmp_path / "demo.db"
    rc = demo.main(["--seconds", "3", "--size", "test", "--tuning-log", str(log), "--population", "128",
                    "--batch-size", "8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "batch_matmul" in out
    assert out.count("-> OK") == 2, out                       # vs JAX, then tuned vs the reference interpreter
    m = re.search(r"default schedules ([\d.]+) ms, tuned ([\d.]+) ms -> speedup ([\d.]+)x", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out
    assert log.exists()
    assert len(list((tmp_path / "logs").glob("tune-*.jsonl"))) == 1


def test_demo_unknown_model(capsys):
    assert demo.main(["--model", "no_such_model"]) == 2
    assert "no bundled model 'no_such_model'" in capsys.readouterr().err
