"""The benchmark harness's bookkeeping (no timing): the marked markdown section, the error check,
and a table with a failed model."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


common = _load("common")
run_all = _load("run_all")


def test_replace_section_keeps_the_rest_and_replaces_the_marked_part():
    before = "# Benchmarks\n\nintro | text\n\n"
    after = "\n## GPU\n\nother results\n"
    text = before + common.START + "\nold table\nold line\n" + common.END + after
    out = common.replace_section(text, "new table\n")
    assert out == before + common.START + "\nnew table\n" + common.END + after
    assert common.replace_section(out, "new table") == out          # rerun: same file


def test_replace_section_appends_when_markers_are_missing():
    out = common.replace_section("# Benchmarks\n\nkept\n", "body")
    assert out == "# Benchmarks\n\nkept\n\n" + common.START + "\nbody\n" + common.END + "\n"
    assert common.replace_section("", "body") == common.START + "\nbody\n" + common.END + "\n"


def test_write_markdown_rewrites_only_the_section(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# B\n\nhand-written notes\n" + common.START + "\nx\n" + common.END + "\ntail\n")
    run_all.write_markdown(path, "fresh")
    assert path.read_text() == "# B\n\nhand-written notes\n" + common.START + "\nfresh\n" + common.END + "\ntail\n"


def test_compare_tolerance_scales_with_the_output():
    ref = np.array([1000.0, -2.0, 0.0], np.float32)
    ok = common.compare([ref + np.float32(0.05)], [ref])                    # 0.05 <= 1e-4*|r| + 1e-4*1000
    assert ok["ok"] and abs(ok["max_abs_err"] - 0.05) < 1e-3
    bad = common.compare([ref + np.array([0, 0, 0.2], np.float32)], [ref])   # 0.2 > 0.1 at the zero
    assert not bad["ok"] and "1 of 3" in bad["why"]
    assert not common.compare([np.array([np.nan])], [np.array([1.0])])["ok"]
    assert not common.compare([np.zeros(3)], [np.zeros(4)])["ok"]


def _timing(ms):
    return {"median_s": ms / 1e3, "min_s": ms / 1e3, "max_s": ms / 1e3, "p10_s": ms / 1e3, "p90_s": ms / 1e3,
            "n": 20, "spread": 0.0}


def test_table_reports_a_failed_model_in_its_row():
    pk = {"peak_gflops": 100.0, "peak_gbs": 20.0}
    good = {"model": "relu_chain", "flops": 4e7, "min_bytes": 8e7, "bound": "bytes",
            "compile": {"ok": True, "wall_s": 0.5}, "hlotune": {"ok": True, "timing": _timing(2.0)},
            "jax": {"ok": True, "timing": _timing(4.0), "first_call_s": 0.1},
            "check": {"against": "jax", "ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0}}
    broken = {"model": "matmul", "flops": 2e9, "min_bytes": 1e7, "bound": "flops",
              "compile": {"ok": False, "error": "CompileError: no | schedule"},
              "jax": {"ok": True, "timing": _timing(10.0), "first_call_s": 0.1}}
    for r in (good, broken):
        r["derived"] = run_all.derived(r, pk)
        r["missed"] = run_all.row_targets(r, r["derived"])
    assert good["missed"] == [] and good["derived"]["speedup"] == 2.0
    assert abs(good["derived"]["rate"] - 40.0) < 1e-9            # 8e7 bytes in 2 ms
    assert broken["missed"] == ["did not run"]
    lines, notes = run_all.table([good, broken], pk)
    row = next(ln for ln in lines if ln.startswith("| matmul"))
    assert "FAIL: did not run" in row
    assert any("no \\| schedule" in n for n in notes)
    assert "2.00x" in lines[-1] and "(1 models)" in lines[-1]   # geometric mean over the models with both


def test_tuned_section_judges_issue_6_targets_and_names_the_databases(tmp_path):
    (tmp_path / "relu_chain.db").write_bytes(b"")
    assert run_all.tuning_log_of("relu_chain", str(tmp_path)) == str(tmp_path / "relu_chain.db")
    assert run_all.tuning_log_of("matmul", str(tmp_path)) is None and run_all.tuning_log_of("x", None) is None
    pk = {"peak_gflops": 100.0, "peak_gbs": 20.0}
    rows = []
    for name, ours, jax in (("relu_chain", 2.0, 4.0), ("matmul", 10.0, 9.0)):
        r = {"model": name, "flops": 4e7, "min_bytes": 8e7, "bound": "bytes", "compile": {"ok": True, "wall_s": 0.5},
             "hlotune": {"ok": True, "timing": _timing(ours)},
             "jax": {"ok": True, "timing": _timing(jax), "first_call_s": 0.1},
             "tuning_log": run_all.tuning_log_of(name, str(tmp_path))}
        r["derived"] = run_all.derived(r, pk)
        r["missed"] = run_all.row_targets(r, r["derived"])
        rows.append(r)
    info = {"loadavg": (0.5, 0.5, 0.5)}
    text = run_all.render_markdown(rows, info, pk, "cmd", "now", 1.0, 0.0, False, tuned=True)
    assert text.startswith("## CPU: tuned schedules vs JAX-jit")
    assert "relu_chain (relu_chain.db)" in text and "no database (default schedules): matmul" in text
    assert "NOT MET (matmul)" in text and "1.34x -> NOT MET" in text     # geomean of 2.0 and 0.9
    path = tmp_path / "b.md"
    path.write_text("# B\n" + common.START + "\ndefault table\n" + common.END + "\n")
    run_all.write_markdown(path, text, tuned=True)
    out = path.read_text()
    assert "default table" in out and run_all.TUNED_START in out and out.index(common.END) < out.index(text[:20])


def test_label_noise_bookkeeping():
    import math

    ln = _load("label_noise")
    keys = ["a"] * 8 + ["b"] * 8 + ["c"] * 3          # "c": too few records to count
    truth = [float(2 ** i) for i in range(19)]
    same = list(truth)
    backwards = [-x for x in truth]
    assert ln.agreement(keys, same, truth) == 1.0
    assert ln.agreement(keys, backwards, truth) == 0.0
    half = same[:8] + backwards[8:16] + same[16:]       # "a" right, "b" backwards: the mean over workloads
    assert ln.agreement(keys, half, truth) == 0.5
    with_inf = same[:7] + [math.inf] + same[8:]         # "a" left with 7 finite values: only "b" counts
    assert ln.agreement(keys, with_inf, backwards) == 0.0
    assert ln.close_pairs(keys, [1.0] * 19) == 1.0      # every pair within 10 %
    assert ln.close_pairs(keys, truth) == 0.0           # every pair 2x or more apart
    # a model's scores (higher = faster) against the database's costs, each pass and the best of all: "a" ranked
    # right, "b" backwards, "c" without predictions (NaN) left out
    scores = [-x for x in truth[:8]] + truth[8:16] + [math.nan] * 3
    got = ln.model_against_passes(keys, scores, {"S1": truth}, truth)
    assert got == {"S1": 0.5, "orig": 0.5, "best of all": 0.5}
    # the seeded sample: at most per_task valid records of each workload, never a failed one, the same every time
    Rec = type("Rec", (), {})
    recs = []
    for k, n in (("a", 10), ("b", 3)):
        for j in range(n):
            r = Rec()
            r.workload_key, r.costs = k, ((1.0,) if j != 1 else ())
            recs.append(r)
    got = ln.pick(recs, 4, 0)
    assert got == ln.pick(recs, 4, 0) and 1 not in got and 11 not in got
    assert sum(recs[i].workload_key == "a" for i in got) == 4 and sum(recs[i].workload_key == "b" for i in got) == 2
