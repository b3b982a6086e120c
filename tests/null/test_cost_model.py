"""Cost model: fit/predict/save/load round trip, bad model files, tiny training sets, ranking metrics
against brute force and hand-computed values."""

import itertools
import json
import warnings

import numpy as np
import pytest

import hlotune
from hlotune.cost_model.metrics import implied_ceiling, pairwise_accuracy, peak_at_k, remeasure_agreement
from hlotune.cost_model.model import CostModel, CostModelWarning, RandomModel, Sample
from hlotune.cost_model.sampling import factor_variants
from hlotune.errors import InputError
from hlotune.schedule_space.default import default_schedule
from hlotune.schedule_space.steps import Schedule
from hlotune.target import Target
from tests.conftest import model_path


class _Task:
    def __init__(self, key, compute):
        self.key, self.compute = key, compute


@pytest.fixture(scope="module")
def data():
    sg = hlotune.load_model(model_path("dense_bias_relu")).frontend.subgraphs[0]
    cd, key = sg.workload.compute, sg.workload.key
    rng = np.random.default_rng(0)
    scheds = [Schedule(key, s) for s in factor_variants(cd, default_schedule(cd, Target.host_cpu()), rng, 60)]
    # synthetic costs: a smooth function of the tile sizes (what the model must learn to rank)
    costs = [1e-6 * (1 + sum(abs(np.log2(f) - 2) for st in s.steps if hasattr(st, "factors") for f in st.factors))
             for s in scheds]
    return _Task(key, cd), [Sample(key, cd, s, (c,)) for s, c in zip(scheds, costs)], scheds, costs


def test_fit_predict_save_load(tmp_path, data):
    task, samples, scheds, costs = data
    m = CostModel(seed=3, rounds=30).fit(samples[:48])
    assert m.trained
    p = m.predict(task, scheds)
    assert p.shape == (len(scheds),)
    assert pairwise_accuracy(costs, p) > 0.7
    path = tmp_path / "m.json"
    m.save(path)
    m2 = CostModel.load(path)
    np.testing.assert_allclose(m2.predict(task, scheds), p, rtol=1e-6)
    again = CostModel(seed=3, rounds=30).fit(samples[:48]).predict(task, scheds)
    np.testing.assert_allclose(again, p)          # seeded: deterministic


def test_bad_model_files(tmp_path, data):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="bad.json"):
        CostModel.load(bad)
    m = CostModel(seed=0, rounds=5).fit(data[1])
    good = tmp_path / "good.json"
    m.save(good)
    doc = json.loads(good.read_text())
    doc["version"] = 99
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="version 99"):
        CostModel.load(old)
    doc["version"] = 1
    doc["booster"] = "AAAA"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="broken.json"):
        CostModel.load(broken)


def test_tiny_training_set_stays_random(data):
    task, samples, scheds, _ = data
    m = CostModel(seed=0)
    with pytest.warns(CostModelWarning):
        m.fit(samples[:3])
    assert not m.trained
    assert m.predict(task, scheds).shape == (len(scheds),)
    with pytest.warns(CostModelWarning):
        CostModel(seed=0).fit([])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.update(samples[3:5])                    # still too few: quietly random
    assert not m.trained
    r = RandomModel(1)
    assert np.array_equal(r.predict(task, scheds), RandomModel(1).predict(task, scheds))


def _pairwise_brute(c, s):
    good = tot = 0.0
    for i, j in itertools.permutations(range(len(c)), 2):
        if c[i] < c[j]:
            tot += 1
            good += 1.0 if s[i] > s[j] else (0.5 if s[i] == s[j] else 0.0)
    return good / tot


def test_metrics():
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = rng.integers(1, 6, 12).astype(float)
        s = rng.integers(0, 4, 12).astype(float)
        assert pairwise_accuracy(c, s) == pytest.approx(_pairwise_brute(c, s))
    c = [4.0, 1.0, 2.0, 8.0]
    assert pairwise_accuracy(c, [-4, -1, -2, -8]) == 1.0 and pairwise_accuracy(c, [4, 1, 2, 8]) == 0.0
    s = [0.9, 0.1, 0.5, 0.8]        # ranking: 0, 3, 2, 1
    assert peak_at_k(c, s, 1) == pytest.approx(1 / 4)
    assert peak_at_k(c, s, 3) == pytest.approx(1 / 2)
    assert peak_at_k(c, s, 4) == 1.0


def test_update_policy_warm_start_and_retrain(data):
    """Random until MIN_SAMPLES; then a full training; growth of 25% warm-starts (WARM_ROUNDS more trees);
    doubling retrains from scratch; a loaded (pretrained) model is warm-started by its first updates."""
    from hlotune.cost_model import model as cm

    task, samples, scheds, costs = data
    m = CostModel(seed=0, rounds=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.update(samples[:8])
    assert not m.trained and m.train_count == 0
    m.update(samples[8:32])                                    # 32 = MIN_SAMPLES: first (full) training
    assert m.trained and m.train_count == 1 and m._warm_trees == 0
    trees = m.booster.num_boosted_rounds()
    m.update(samples[32:36])                                   # +4 < RETRAIN_MIN_NEW: no training
    assert m.train_count == 1
    m.update(samples[36:44])                                   # 44 >= 1.25 * 32: warm start
    assert m.train_count == 2 and m.booster.num_boosted_rounds() == trees + cm.WARM_ROUNDS
    m.update(samples[44:60] + samples[:8])                     # 68 >= 2 * 32: full retrain
    assert m.train_count == 3 and m.booster.num_boosted_rounds() == 10 and m._warm_trees == 0


def test_pretrained_is_warm_started(tmp_path, data):
    from hlotune.cost_model import model as cm

    task, samples, scheds, costs = data
    path = tmp_path / "pre.json"
    CostModel(seed=0, rounds=10).fit(samples[:40]).save(path)
    m = CostModel.load(path)
    assert m.pretrained and m.trained and m.params["nthread"] == 1
    m.update(samples[40:50])
    assert m.booster.num_boosted_rounds() == 10 + cm.WARM_ROUNDS and m.train_count == 1


def test_labels_use_fastest_repeat():
    from hlotune.cost_model.model import labels

    s = [Sample("a", None, None, (2.0, 9.0, 9.0)), Sample("a", None, None, (4.0, 4.0, 4.0)),
         Sample("a", None, None, ()), Sample("b", None, None, (1.0,)), Sample("b", None, None, (3.0, 5.0))]
    np.testing.assert_allclose(labels(s), [1.0, 0.5, 0.0, 1.0, 1 / 3])


def test_eval_command_on_a_database(tmp_path, data, capsys):
    """`hlotune cost-model eval DB` (leave one workload out) and `train` + `eval --model` on a database of two
    workloads with synthetic costs; the reported numbers equal the metrics module's on the same scores."""
    from hlotune.cli import main
    from hlotune.database import Record, open_database
    from hlotune.ir.workload import workload_to_json
    from hlotune.schedule_space.steps import schedule_to_json

    task, samples, scheds, costs = data
    db_path = str(tmp_path / "t.db")
    db = open_database(db_path)
    wl = workload_to_json(task.compute)
    recs = []
    for wk in ("w1-aaaa", "w1-bbbb"):   # the same compute under two keys: two "workloads"
        for s, c in zip(scheds, costs):
            recs.append(Record(workload_key=wk, workload=wl, target="t", target_family="f",
                               steps=json.dumps(schedule_to_json(s)), schedule_key=s.key + wk, costs=(c, c * 1.01)))
    db.add_many(recs)
    db.close()
    assert main(["cost-model", "eval", db_path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_task"]) == {"w1-aaaa", "w1-bbbb"}
    assert out["mean"]["pairwise_accuracy"] > 0.7          # the other workload's records teach the same costs
    model_path_ = str(tmp_path / "m.json")
    assert main(["cost-model", "train", db_path, "-o", model_path_]) == 0
    capsys.readouterr()
    assert main(["cost-model", "eval", db_path, "--model", model_path_, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    m = CostModel.load(model_path_)
    want = pairwise_accuracy(costs, m.predict(task, scheds))
    assert got["per_task"]["w1-aaaa"]["pairwise_accuracy"] == pytest.approx(want)
    (tmp_path / "bad.json").write_text("{}")
    assert main(["cost-model", "eval", db_path, "--model", str(tmp_path / "bad.json")]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_remeasure_agreement_hand_computed():
    """Programs A, B, C measured twice: by the second measurements C < A < B; the first ones order (A, B) alike
    but put C last, so 1 of the 3 pairs agrees; at 1.5x only (C, A) and (C, B) count, and both disagree."""
    groups = [[1.0, 1.1], [2.0, 1.5], [3.0, 0.5], [7.0]]          # the single measurement is ignored
    assert remeasure_agreement(groups) == (pytest.approx(1 / 3), 3)
    assert remeasure_agreement(groups, 1.5) == (0.0, 2)
    acc, n = remeasure_agreement([[1.0, 1.0]])
    assert np.isnan(acc) and n == 0


@pytest.mark.parametrize("noise", [0.03, 0.08, 0.15])
def test_implied_ceiling_brackets_a_perfect_model(noise):
    # two noisy measurements of the same true costs agree on q of the pairs; the true costs (a perfect model) score p
    # against one of them: q <= p <= implied_ceiling(q)
    rng = np.random.default_rng(0)
    true = np.exp(rng.normal(0.0, 0.3, 400))
    one, two = (true * np.exp(rng.normal(0.0, noise, 400)) for _ in range(2))
    q = pairwise_accuracy(two, -one)
    p = pairwise_accuracy(one, -true)
    assert q - 0.01 <= p <= implied_ceiling(q) + 0.01


def test_implied_ceiling_exact_when_every_pair_is_alike():
    for p in (0.5, 0.7, 0.9, 1.0):
        assert implied_ceiling(p * p + (1 - p) * (1 - p)) == pytest.approx(p)
    assert implied_ceiling(1.0) == 1.0 and implied_ceiling(0.5) == 0.5 and implied_ceiling(0.3) == 0.5
    assert np.isnan(implied_ceiling(float("nan")))


def test_train_exclude_leaves_workloads_out(tmp_path, data, capsys):
    """`cost-model train --exclude KEY`: the held-out workload's records are not trained on."""
    from hlotune.cli import main
    from hlotune.database import Record, open_database
    from hlotune.ir.workload import workload_to_json
    from hlotune.schedule_space.steps import schedule_to_json

    task, samples, scheds, costs = data
    db_path = str(tmp_path / "t.db")
    db = open_database(db_path)
    wl = workload_to_json(task.compute)
    db.add_many([Record(workload_key=wk, workload=wl, target="t", target_family="f",
                        steps=json.dumps(schedule_to_json(s)), schedule_key=s.key + wk, costs=(c,))
                 for wk in ("w1-aaaa", "w1-bbbb") for s, c in zip(scheds, costs)])
    db.close()
    out = str(tmp_path / "m.json")
    assert main(["cost-model", "train", db_path, "-o", out, "--exclude", "w1-bbbb"]) == 0
    assert f"trained on {len(scheds)} records of 1 workloads" in capsys.readouterr().out
    assert main(["cost-model", "train", db_path, "-o", out, "--exclude", "w1-aaaa", "w1-bbbb"]) == 2
    assert "too few usable records (0)" in capsys.readouterr().err


def test_shipped_model_loads_and_ranks(data):
    """The CPU model shipped with hlotune loads with this hlotune's feature version (retrain it when the features
    change: docs/cost_model.md) and, never having seen these synthetic costs, still returns finite scores."""
    from hlotune.search.tuner import BUILTIN_MODEL, make_cost_model

    assert BUILTIN_MODEL.is_file(), "hlotune/data/cost_model_cpu.json is missing"
    m = CostModel.load(BUILTIN_MODEL)
    assert m.trained and m.pretrained
    task, samples, scheds, costs = data
    assert np.isfinite(m.predict(task, scheds)).all()
    auto = make_cost_model(None, 0, Target.host_cpu())
    assert auto.trained and auto.pretrained
    assert not make_cost_model("none", 0, Target.host_cpu()).trained
    cuda = Target("cuda", "nvidia_h200")
    assert not make_cost_model("auto", 0, cuda).trained    # the shipped model is a CPU model


def test_incompatible_shipped_model_falls_back(tmp_path, monkeypatch):
    """A shipped model that does not fit (e.g. an older feature version) is a warning and a fresh model."""
    import hlotune.search.tuner as tuner

    bad = tmp_path / "cost_model_cpu.json"
    bad.write_text('{"format": "hlotune-cost-model", "version": 99}')
    monkeypatch.setattr(tuner, "BUILTIN_MODEL", bad)
    with pytest.warns(UserWarning, match="shipped cost model cannot be used"):
        m = tuner.make_cost_model(None, 0, Target.host_cpu())
    assert not m.trained
    monkeypatch.setenv("HLOTUNE_COST_MODEL", str(bad))      # an explicit path is an error, not a fallback
    with pytest.raises(InputError, match="cost_model_cpu.json"):
        tuner.make_cost_model(None, 0, Target.host_cpu())


def test_pair_weights_and_objective_gradient():
    """packrank: the pair weights by hand, and the objective's gradient / hessian against finite differences of
    the weighted pairwise logistic loss on program scores (sums of statement rows)."""
    from hlotune.cost_model import model as cm
    from hlotune.cost_model.model import _pair_objective, pair_weights

    y = np.array([1.0, 0.5, 0.0])
    W = pair_weights(y)
    raw = np.array([[0, 1.0 * 1, 1.0 * 2], [0, 0, 0.5 * 2], [0, 0, 0]])     # max(y) x min(|log2 ratio|, 2)
    np.testing.assert_allclose(W, raw * 3 / raw.sum())
    y = np.array([1.0, 0.25, 0.6, 0.4, 1.0])
    keys = ["a", "a", "a", "b", "b"]
    pid = np.array([0, 0, 1, 2, 3, 3, 4])         # program 0 and 3 have two statements
    obj = _pair_objective(y, keys, pid, 0)
    rows = np.random.default_rng(0).normal(size=len(pid))
    s0 = np.bincount(pid, weights=rows, minlength=5)

    def loss(rows):     # LambdaRank weights: fixed at the ranking of the point the gradient is taken at
        s = np.bincount(pid, weights=rows, minlength=5)
        tot = 0.0
        for grp in ([0, 1, 2], [3, 4]):
            Wg = pair_weights(y[grp])
            if cm.PAIR_DISCOUNT:
                D = 1.0 / np.log2(2.0 + np.argsort(np.argsort(-s0[grp])))
                Wg = Wg * (np.abs(D[:, None] - D[None, :]) + cm.PAIR_DISCOUNT_FLOOR)
                Wg *= len(grp) / Wg.sum()
            for a, i in enumerate(grp):
                for b, j in enumerate(grp):
                    tot += Wg[a, b] * np.log1p(np.exp(s[j] - s[i]))
        return tot

    g, h = obj(rows, None)
    eps = 1e-6
    num = [(loss(rows + eps * e) - loss(rows - eps * e)) / (2 * eps) for e in np.eye(len(pid))]
    np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8)
    assert (h > 0).all() and h[0] == h[1]          # statements of one program share its hessian


def test_packrank_mode_ranks_and_round_trips(tmp_path, data):
    task, samples, scheds, costs = data
    m = CostModel(seed=3, rounds=30, mode="packrank").fit(samples[:48])
    p = m.predict(task, scheds)
    assert pairwise_accuracy(costs, p) > 0.7
    m.save(tmp_path / "r.json")
    m2 = CostModel.load(tmp_path / "r.json")
    assert m2.mode == "packrank"
    np.testing.assert_allclose(m2.predict(task, scheds), p, rtol=1e-6)
    m2.update(samples[48:60])                      # warm start with the same objective
    assert m2.booster.num_boosted_rounds() == 30 + 20


def test_eval_extra_training_records(tmp_path, data, capsys):
    """`cost-model eval DB --extra DB2`: DB2's records train every held-out fold and are never scored.  One workload
    alone cannot be ranked (nothing to train on: random scores); with another workload's records (the same costs)
    as extra data it is; extra records of the held-out workload itself are left out of its fold (no leak)."""
    from hlotune.cli import main
    from hlotune.database import Record, open_database
    from hlotune.ir.workload import workload_to_json
    from hlotune.schedule_space.steps import schedule_to_json

    task, samples, scheds, costs = data
    wl = workload_to_json(task.compute)

    def write(path, keys):
        db = open_database(str(path))
        db.add_many([Record(workload_key=wk, workload=wl, target="t", target_family="f",
                            steps=json.dumps(schedule_to_json(s)), schedule_key=s.key + wk, costs=(c, c * 1.01))
                     for wk in keys for s, c in zip(scheds, costs)])
        db.close()
        return str(path)

    main_db, other, same = write(tmp_path / "a.db", ["w1-aaaa"]), write(tmp_path / "o.db", ["w1-cccc"]), \
        write(tmp_path / "s.db", ["w1-aaaa"])
    scores = {}
    for label, extra in (("alone", []), ("other", [other]), ("same", [same])):
        assert main(["cost-model", "eval", main_db, "--json", *(["--extra", *extra] if extra else [])]) == 0
        out = json.loads(capsys.readouterr().out)
        assert set(out["per_task"]) == {"w1-aaaa"}
        scores[label] = out["mean"]["pairwise_accuracy"]
    assert scores["other"] > 0.7 and scores["alone"] < 0.65 and scores["same"] < 0.65, scores


def test_many_statement_programs_train_without_diverging():
    """A program's score is the sum of its statements' predictions: with 22 rows per program the per-row Newton
    steps once added up to 22 times the program's step and the training diverged to NaN (session 9).  The rows'
    hessians now carry the row count: predictions stay finite and rank programs whose throughput is a sum over their
    statements of one feature (what the sum of statement scores can represent)."""
    import hlotune.cost_model.model as cm

    rng = np.random.default_rng(0)
    feats, samples = [], []
    for _ in range(300):
        rows = int(rng.choice([1, 4, 22]))
        f = rng.uniform(0, 8, (rows, cm.NUM_FEATURES))
        feats.append(f)
        samples.append(Sample("w1-many", None, None, (1e-6 / (0.1 + f[:, 0].sum() / 8),)))   # throughput: a sum
    costs = [s.cost for s in samples]
    m = CostModel(seed=0).fit(samples, feats)
    p = m.predict_features(feats)
    assert np.isfinite(p).all() and pairwise_accuracy(costs, p) > 0.8
    old = cm.ROW_HESSIAN
    try:
        cm.ROW_HESSIAN = False     # the per-row program hessian of before: diverges on these programs
        q = CostModel(seed=0).fit(samples, feats).predict_features(feats)
    finally:
        cm.ROW_HESSIAN = old
    assert not np.isfinite(q).all() or pairwise_accuracy(costs, q) < pairwise_accuracy(costs, p)
