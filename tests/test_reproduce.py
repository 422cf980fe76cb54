"""mixzoo reproduce: every spec loads and validates; the smoke scale runs end to end on the CPU for
one figure of each task family and resumes without new work; claims are judged by the stated
rule on synthetic rows (an ordering that holds, one that fails, one inconclusive)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_sweeps_helpers import journal, studies

from mixzoo.cli import main
from mixzoo.reproduce import figures, get, reference_rows, validate
from mixzoo.reproduce.collect import Results, points
from mixzoo.reproduce.spec import SCALES, Claim
from mixzoo.reproduce.verdict import combine, evaluate, evaluate_all, interval, judge, t975

EIGHT = {"lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena"}
NAMES = ["lla-fig3", "lla-fig4", "lla-fig5a", "lla-fig5b", "lla-fig6", "parallax-mad", "parallax-mad-hard"]
NOTES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "paper_results.md"


# ---------------------------------------------------------------------------- the specs
def test_the_seven_figures_are_there():
    assert list(figures()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_spec_loads_and_validates(name):
    fig = get(name)
    validate(fig)
    assert tuple(fig.scales) == SCALES
    for scale in SCALES:
        pts, seeds = points(fig, scale)
        settings = [p for p in pts if not p.aggregate]
        assert len(settings) == len(fig.scale(scale).settings)
        assert len({p.label for p in pts}) == len(pts)
        assert seeds == list(range(fig.scale(scale).seeds))
    assert len(fig.scale("paper").settings) >= len(fig.scale("small").settings) >= len(fig.scale("smoke").settings)
    if fig.kind == "sweep":   # all eight mechanisms run at small and paper scale
        assert set(fig.models_at("small")) == EIGHT == set(fig.models_at("paper"))
        assert max(fig.scale("smoke").train["steps"], 0) <= 10
    assert fig.claims and all(c.source for c in fig.claims)
    keys = {c.key for c in fig.choices}
    assert ({"width", "steps", "lr", "batch"} if fig.kind == "sweep" else {"sequences", "grids"}) <= keys


@pytest.mark.parametrize("name", NAMES)
def test_sources_cite_lines_of_the_reference_notes(name):
    fig = get(name)
    cites = [s.source for s in fig.stated] + [c.source for c in fig.claims] + [r.source for r in fig.reference]
    pattern = re.compile(r"^(PR|TS):\d+(-\d+)?(; (PR|TS):\d+(-\d+)?)*$")
    for c in cites:
        assert pattern.match(c), c
    if NOTES.is_file():      # beside a developer's checkout (not in CI)
        n = len(NOTES.read_text().splitlines())
        for c in cites:
            for m in re.finditer(r"PR:(\d+)(?:-(\d+))?", c):
                assert 1 <= int(m.group(1)) <= int(m.group(2) or m.group(1)) <= n, c


def test_a_sweep_figure_is_an_ordinary_sweep_spec_with_an_enqueued_grid():
    from mixzoo.reproduce.spec import sweep_raw
    from mixzoo.sweeps.spec import load
    fig = get("lla-fig5b")
    raw = sweep_raw(fig, "paper")
    spec = load(fig.name, None, raw=raw)
    assert len(spec.units) == 12 * 8
    u = next(x for x in spec.units if x.model == "gdn" and x.knobs["L"] == 512 and x.knobs["kv"] == 128)
    assert u.trials == 4 and [e["lr"] for e in u.enqueue] == [1e-4, 4.64e-4, 2.15e-3, 1e-2]
    assert u.space["conv_size"] == ("cat", [1])                 # short convolutions off (stated)
    assert "allow_neg_eigval" not in u.space                    # mechanism knobs at their defaults
    assert u.fixed["batch_size"] == 128 and u.fixed["steps"] == 50_000 and u.pruner["kind"] == "none"
    assert raw["train"]["d_model"] == 128 and u.knobs["V"] == 8192


def test_mad_settings_are_the_tasks_presets():
    from mixzoo.registry import get_task
    from mixzoo.reproduce.parallax import MAD, MAD_HARD, n_train_of
    from mixzoo.tasks.mad import MAD_HARD_SETTINGS, MAD_SETTINGS
    paper = MAD.scale("paper").settings
    assert len(paper) == sum(len(v) for v in MAD_SETTINGS.values()) == 66
    for s in paper:
        assert get_task(s["task"]).presets[s["preset"]]["n_train"] == n_train_of(s["task"], s["preset"])
        assert s["steps"] == 200 * n_train_of(s["task"], s["preset"]) // 128
    hard = [s for s in MAD_HARD.scale("paper").settings if s["tags"]["range"] == "hard"]
    assert len(hard) == sum(len(v) for v in MAD_HARD_SETTINGS.values()) == 17
    assert all(s["preset"].startswith("hard-") for s in hard)
    assert {r.model for r in MAD.reference if r.column == "paper"} == {"parallax", "softmax", "gdn", "mesa", "mamba"}


@pytest.mark.parametrize("name", ["lla-fig5a", "lla-fig5b", "lla-fig6", "parallax-mad", "parallax-mad-hard"])
def test_small_is_about_half_an_hour_by_the_estimate(name):
    from mixzoo.reproduce.cost import estimate
    e = estimate(get(name), "small")
    assert 15 * 60 < e["seconds"] < 40 * 60 and "not measured" in e["basis"]


# ---------------------------------------------------------------------------- verdicts
def test_interval_and_judge():
    assert t975(1) == 12.706 and abs(t975(200) - 1.972) < 2e-3
    m, h, n = interval([1.0, 2.0, 3.0])
    assert (m, n) == (2.0, 3) and abs(h - 4.303 / 3 ** 0.5) < 1e-9
    assert interval([1.0])[2] == 1 and interval([])[2] == 0
    assert judge("above", 0, 0.1, 0.3) == "holds" and judge("above", 0, -0.3, -0.1) == "fails"
    assert judge("above", 0, -0.1, 0.3) == "inconclusive"
    assert judge("below", 1, 0.2, 0.9) == "holds" and judge("below", 1, 1.1, 2) == "fails"
    assert judge("within", 0.05, -0.02, 0.03) == "holds" and judge("within", 0.05, 0.2, 0.3) == "fails"
    assert judge("within", 0.05, -0.01, 0.2) == "inconclusive"
    assert combine(["holds", "holds"], "every") == "holds" and combine(["holds", "fails"], "every") == "fails"
    assert combine(["holds", "inconclusive"], "every") == "inconclusive"
    assert combine(["fails", "holds"], "some") == "holds" and combine(["fails", "fails"], "some") == "fails"
    assert combine(["fails", "inconclusive"], "some") == "inconclusive" and combine([], "every") == "inconclusive"
    assert combine(["holds", "n/a"], "every") == "holds"


def _rows(fig, scale: str, values: dict) -> list[dict]:
    """Leaderboard-like rows: values[(point label, model)] = [one value per seed]."""
    pts, _ = points(fig, scale)
    out = []
    for p in pts:
        for m, study in p.studies.items():
            for seed, v in enumerate(values.get((p.label, m), [])):
                out.append({"study": study, "model": m, "seed": seed, "state": "COMPLETE", "metric_value": v,
                            "created_at": "2026-12-01", "metrics_json": json.dumps({"x": v})})
    return out


def _verdict(fig, values, claim_id, scale="small"):
    res = Results(fig, scale, _rows(fig, scale, values))
    return next(r for r in evaluate_all(fig.claims, res) if r.claim.id == claim_id)


def test_an_ordering_that_holds_one_that_fails_one_inconclusive():
    fig = get("lla-fig6")
    base = {("N=48", "lla"): [0.50, 0.52, 0.51], ("N=48", "softmax"): [0.52, 0.50, 0.53]}
    holds = _verdict(fig, {**base, ("N=48", "gdn"): [0.97, 0.98, 0.99]}, "fig6-gdn-best-48")
    assert holds.verdict == "holds" and [p.n for p in holds.parts] == [3, 3]
    fails = _verdict(fig, {**base, ("N=48", "gdn"): [0.20, 0.22, 0.21]}, "fig6-gdn-best-48")
    assert fails.verdict == "fails"
    unsure = _verdict(fig, {**base, ("N=48", "gdn"): [0.95, 0.20, 0.60]}, "fig6-gdn-best-48")
    assert unsure.verdict == "inconclusive"
    one_seed = _verdict(fig, {("N=48", "lla"): [0.5], ("N=48", "softmax"): [0.5], ("N=48", "gdn"): [0.99]},
                        "fig6-gdn-best-48")
    assert one_seed.verdict == "inconclusive" and one_seed.parts[0].n == 1
    missing = _verdict(fig, base, "fig6-gdn-best-48")      # gdn has no rows: no paired values
    assert missing.verdict == "inconclusive"
    gap = _verdict(fig, {**base, ("N=48", "gdn"): [0.60, 0.61, 0.62]}, "fig6-gap-48")   # above lla, not by 0.23
    assert gap.verdict == "fails"
    # a claim about a setting that small does not run (N = 96): inconclusive, and says why
    absent = _verdict(fig, base, "fig6-gdn-over-lla-96")
    assert absent.verdict == "inconclusive" and "no matching point" in absent.note


def test_close_is_an_equivalence_test_over_every_setting():
    fig = get("lla-fig6")
    close = {("N=12", "lla"): [0.70, 0.71, 0.72], ("N=12", "softmax"): [0.71, 0.70, 0.73],
             ("N=48", "lla"): [0.50, 0.51, 0.52], ("N=48", "softmax"): [0.51, 0.52, 0.51]}
    assert _verdict(fig, close, "fig6-lla-softmax-close").verdict == "holds"
    apart = {**close, ("N=12", "softmax"): [0.90, 0.91, 0.92]}
    assert _verdict(fig, apart, "fig6-lla-softmax-close").verdict == "fails"


def test_lower_is_better_ratios_trends_and_some():
    fig = get("lla-fig5a")       # mse: lower is better; small has L=256 at S=16 and S=64
    v = {}
    for m, (s16, s64) in {"lla": (0.05, 0.07), "softmax": (0.60, 0.52), "mamba": (0.7, 0.6), "gla": (0.8, 0.7),
                          "hyena": (0.9, 0.8), "gdn": (0.55, 0.48)}.items():
        v[("L=256,S=16", m)] = [s16, s16 * 1.02, s16 * 0.98]
        v[("L=256,S=64", m)] = [s64, s64 * 1.01, s64 * 0.99]
    assert _verdict(fig, v, "fig5a-lla-lowest").verdict == "holds"
    assert _verdict(fig, v, "fig5a-gap-256-64").verdict == "holds"            # 0.07 / 0.52 < 0.5
    shrink = _verdict(fig, v, "fig5a-gaps-shrink-with-S")                     # the gaps shrink from S 16 to 64
    assert shrink.verdict == "holds" and all(p.where.startswith("S 16->64") for p in shrink.parts)
    grow = dict(v)
    grow[("L=256,S=64", "softmax")] = [0.9, 0.91, 0.89]                        # softmax's gap grows
    assert _verdict(fig, grow, "fig5a-gaps-shrink-with-S").verdict == "fails"
    fig3 = get("lla-fig3")
    claim = next(c for c in fig3.claims if c.id == "fig3-mesa-first-segment")
    assert claim.quantifier == "some" and claim.metric == "mse_first_segment"


def test_aggregates_are_per_seed_means_of_their_settings():
    fig = get("parallax-mad")
    v = {}
    for t in ("mad-compression", "mad-fuzzy-recall", "mad-recall", "mad-memorization", "mad-noisy-recall",
              "mad-selective-copy"):
        for m, x in {"parallax": 0.8, "softmax": 0.7, "gdn": 0.69, "mesa": 0.68, "mamba": 0.6}.items():
            v[(f"{t} baseline", m)] = [x, x + 0.01, x - 0.01]
    res = Results(fig, "small", _rows(fig, "small", v))
    assert res.series("average", "parallax") == pytest.approx({0: 0.8, 1: 0.81, 2: 0.79})
    assert evaluate(fig.claims[0], res).verdict == "holds"
    # a task with a seed missing drops that seed from the average
    rows = [r for r in _rows(fig, "small", v) if not (r["seed"] == 2 and "mad-recall" in r["study"])]
    assert sorted(Results(fig, "small", rows).series("average", "mesa")) == [0, 1]


def test_a_claim_whose_metric_does_not_exist_at_a_point_is_left_out():
    fig = get("lla-fig3")
    pts, _ = points(fig, "small")
    rows = []
    for p in pts:
        for m, study in p.studies.items():
            for seed in range(3):
                good = {"lla": 0.1, "mesa": 0.3, "softmax": 0.2, "linear": 0.5, "random": 2.0}.get(m, 1.0)
                metrics = {"mse": good + 0.01 * seed, "mse_first_segment": good + 0.01 * seed}
                if p.knobs["S"] < p.knobs["L"]:
                    metrics["mse_after_switch"] = good + 0.01 * seed
                rows.append({"study": study, "model": m, "seed": seed, "state": "COMPLETE",
                             "metric_value": metrics["mse"], "metrics_json": json.dumps(metrics)})
    res = Results(fig, "small", rows)
    r = evaluate(next(c for c in fig.claims if c.id == "fig3-lla-lowest-after-switch"), res)
    assert r.verdict == "holds"
    assert {p.verdict for p in r.parts if p.where == "S=1024"} == {"n/a"}
    # the crossover joins two claims: MesaNet is not ahead on the first segment here, so it fails
    by = {x.claim.id: x for x in evaluate_all(fig.claims, res)}
    assert by["fig3-mesa-mismatch-after-switch"].verdict == "holds"
    assert by["fig3-mesa-first-segment"].verdict == "fails" and by["fig3-crossover"].verdict == "fails"


def test_claims_of_a_synthetic_spec_are_checked_at_load():
    import dataclasses
    fig = get("lla-fig6")
    bad = dataclasses.replace(fig, claims=fig.claims + (Claim("x", "t", "PR:1", kind="diff", a=("lla",),
                                                              b=("nope",)),))
    with pytest.raises(Exception, match="nope"):
        validate(bad)
    bad = dataclasses.replace(fig, claims=(Claim("x", "t", "PR:1", kind="diff", a=("lla",), b=("gdn",),
                                                 where={"N": 1000}),))
    with pytest.raises(Exception, match="selects no point"):
        validate(bad)


# ---------------------------------------------------------------------------- the command
@pytest.fixture
def one_thread():
    """Smoke shapes are a few hundred numbers: one thread is fastest, and on a shared 2-core machine
    two threads per process spin against the other processes' (20 ms a tiny matmul instead of 0.1)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _files(res: Path) -> list[Path]:
    return sorted((res / "leaderboard").rglob("*.parquet")) if (res / "leaderboard").is_dir() else []


@pytest.mark.parametrize("name", ["lla-fig6", "lla-fig3"])
def test_smoke_runs_end_to_end_then_resumes_with_no_new_work(name, tmp_path, capsys, one_thread):
    res = tmp_path / "res"
    argv = ["--results", str(res), "--device", "cpu", "reproduce", name, "--scale", "smoke"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    fig = get(name)
    assert "### Claims" in out and all(c.id in out for c in fig.claims)
    table = (res / "reproduce" / f"{name}.md").read_text()
    assert "## Scale `smoke` (2 seeds)" in table and "## Protocol" in table and "Rule:" in table
    from mixzoo.leaderboard import read_table
    rows = [r for r in read_table(res).to_pylist() if r["study"].startswith(f"{name}[smoke]/")]
    n_models = len(fig.models_at("smoke"))
    assert len([r for r in rows if r["state"] == "COMPLETE"]) == len(fig.scale("smoke").settings) * n_models * 2
    files = _files(res)
    trials = {k: len(v) for k, v in studies(journal(res)).items()} if fig.kind == "sweep" else None
    assert main(argv) == 0                                   # the rerun: nothing new
    assert _files(res) == files
    if trials is not None:
        assert {k: len(v) for k, v in studies(journal(res)).items()} == trials
    recs = [json.loads(x) for x in (res / "reproduce" / f"{name}.runs.jsonl").read_text().splitlines()]
    assert [r["new_rows"] for r in recs] == [len(rows), 0] and all(r["rc"] == 0 for r in recs)
    capsys.readouterr()
    assert main(["--results", str(res), "reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    line = next(x for x in listing.splitlines() if x.startswith(name + " "))
    assert "measured (cpu" in line and "not measured (estimate" in line
    # the HTML report carries the same tables: each claim with the verdict the Markdown table gives it
    assert main(["--results", str(res), "leaderboard", "report"]) == 0
    page = (res / "report.html").read_text()
    sec = page[page.index(f'id="repro-{name}-smoke"'):]
    for c in fig.claims:
        cells = next(x for x in table.splitlines() if x.startswith(f"| {c.id} |")).split(" | ")
        verdict = next(x for x in cells if x.startswith("**")).strip("*")
        row = sec[sec.index(f"<tr><td>{c.id}</td>"):]
        assert f"<td>{verdict}</td>" in row[:row.index("</tr>")]


@pytest.mark.parametrize("name", ["lla-fig4", "lla-fig5a", "lla-fig5b", "parallax-mad", "parallax-mad-hard"])
def test_smoke_runs_for_the_other_figures(name, tmp_path, capsys, one_thread):
    res = tmp_path / "res"
    assert main(["--results", str(res), "--device", "cpu", "reproduce", name, "--scale", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "| point | mechanism | ours (mean ± 95% t) | n |" in out
    fig = get(name)
    ref_cols = {r.column for r in fig.reference}
    for col in ref_cols:
        assert col in out


def test_list_names_every_figure_with_settings_and_costs(tmp_path, capsys):
    assert main(["--results", str(tmp_path / "r"), "reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert "not measured" in line
    assert "2/2/9" in next(x for x in out.splitlines() if x.startswith("lla-fig5a "))


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    res = tmp_path / "res"
    assert main(["--results", str(res), "reproduce", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lla-fig5a" in err[0]
    assert main(["--results", str(res), "reproduce"]) == 2
    capsys.readouterr()
    monkeypatch.setenv("MIXZOO_REFERENCE", str(res))        # smoke rows never land in the reference results
    assert main(["--results", str(res), "--device", "cpu", "reproduce", "lla-fig6", "--scale", "smoke"]) == 2
    assert "never reference" in capsys.readouterr().err and not res.exists()


def test_reference_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXZOO_REFERENCE", str(tmp_path / "ref"))
    assert reference_rows() == []
    from mixzoo.leaderboard import write_rows
    base = {"suite": "state", "task": "state-tracking", "model": "lla", "seed": 0, "state": "COMPLETE",
            "metric_name": "accuracy", "metric_value": 0.5, "run_id": "r1"}
    write_rows(tmp_path / "ref", [{**base, "study": "lla-fig6[small]/state-tracking/lla/N=48#x"}])
    write_rows(tmp_path / "ref", [{**base, "run_id": "r2", "study": "lla-fig6[smoke]/state-tracking/lla/N=4#y"}])
    rows = reference_rows()
    assert [r["study"] for r in rows] == ["lla-fig6[small]/state-tracking/lla/N=48#x"]
    assert reference_rows("lla-fig5b") == [] and len(reference_rows("lla-fig6")) == 1


def test_the_repository_results_hold_no_smoke_rows():
    from mixzoo.reproduce import reference_dir
    d = reference_dir()
    assert (d / "README.md").is_file()
    for p in (d / "leaderboard").rglob("*.parquet") if (d / "leaderboard").is_dir() else []:
        import pyarrow.parquet as pq
        assert not any("[smoke]" in (s or "") for s in pq.read_table(p, columns=["study"]).column(0).to_pylist())


def test_the_repository_reference_rows_carry_their_provenance():
    """Every published row: a GPU run of a committed tree (sha, not dirty), with its command."""
    rows = reference_rows()
    for r in rows:
        assert r["device_name"] and r["device_name"] != "cpu", r["run_id"]
        assert len(r["git_sha"] or "") == 40 and not r["git_dirty"], r["run_id"]
        assert r["command"].startswith("mixzoo") and "reproduce" in r["command"], r["run_id"]
        assert r["state"] == "COMPLETE", r["run_id"]
    assert {s.split("[")[0] for s in (r["study"] for r in rows)} <= set(figures())


def test_importing_the_command_is_light():
    code = ("import sys, mixzoo.reproduce.cli, mixzoo.reproduce as r; r.figures(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_measured_cost_sums_the_pieces_of_an_interrupted_run(tmp_path):
    from mixzoo.reproduce import cost
    recs = [{"scale": "small", "wall_s": 540, "rc": 143, "complete": False, "device": "NVIDIA H200"},
            {"scale": "small", "wall_s": 300, "rc": 0, "complete": True, "device": "NVIDIA H200",
             "finished": "2026-12-02T11:00:00+00:00"},
            {"scale": "small", "wall_s": 5, "rc": 0, "complete": True, "device": "NVIDIA H200"}]   # nothing left
    for r in recs:
        cost.append_record(tmp_path, "lla-fig6", r)
    m = cost.measured([tmp_path / "elsewhere", tmp_path], "lla-fig6", "small")
    assert m["seconds"] == 840 and m["invocations"] == 2 and m["date"] == "2026-12-02"
    assert cost.measured([tmp_path], "lla-fig6", "paper") is None


def test_an_unmeasured_scale_is_estimated_from_a_measured_one(tmp_path):
    """The paper scale's estimate carries the small run's measured/estimated ratio; a CPU run does not count."""
    from mixzoo.reproduce import cost, get
    from mixzoo.reproduce.cli import _cost_cell
    fig = get("lla-fig6")
    assert cost.calibrated(fig, "paper", [tmp_path]) is None
    cost.append_record(tmp_path, "lla-fig6", {"scale": "small", "wall_s": 600, "rc": 0, "complete": True,
                                              "device": "cpu", "finished": "2026-12-02T01:00:00+00:00"})
    assert cost.calibrated(fig, "paper", [tmp_path]) is None
    other = tmp_path / "gpu"
    cost.append_record(other, "lla-fig6", {"scale": "small", "wall_s": 600, "rc": 0, "complete": True,
                                           "device": "NVIDIA H200", "finished": "2026-12-02T01:00:00+00:00"})
    c = cost.calibrated(fig, "paper", [other])
    e_small, e_paper = cost.estimate(fig, "small")["seconds"], cost.estimate(fig, "paper")["seconds"]
    assert c["from"] == "small" and abs(c["factor"] - 600 / e_small) < 1e-9
    assert abs(c["seconds"] - e_paper * 600 / e_small) < 1e-6
    cell = _cost_cell(fig, "paper", [other])
    assert cell.startswith("not measured (estimate ") and "as measured at small" in cell
    assert _cost_cell(fig, "small", [other]).startswith("10 min measured (NVIDIA H200")


def test_add_parser_for_another_command_line():
    import argparse

    from mixzoo.reproduce.cli import add_parser
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers(dest="command"))
    ns = p.parse_args(["reproduce", "lla-fig6", "--scale", "smoke", "--seeds", "2", "--workers", "2"])
    assert (ns.name, ns.scale, ns.seeds, ns.workers, ns.list) == ("lla-fig6", "smoke", 2, "2", False)


def test_leaderboard_show_with_reference(tmp_path, monkeypatch, capsys):
    """``leaderboard show --with-reference``: the published rows beside the user's own, labelled."""
    from mixzoo.api import run
    from mixzoo.cli import main
    hp = dict(steps=2, batch_size=4, eval_every=2, n_train=16, n_val=8, n_test=8, d_model=16, num_heads=1)
    run("mqar", "softmax", knobs=dict(V=16, L=16, kv=2), hparams=hp, results=tmp_path / "ref", device="cpu")
    run("mqar", "softmax", knobs=dict(V=16, L=16, kv=2), hparams=hp, results=tmp_path / "mine", device="cpu")
    monkeypatch.setenv("MIXZOO_REFERENCE", str(tmp_path / "ref"))
    capsys.readouterr()
    assert main(["--results", str(tmp_path / "mine"), "leaderboard", "show", "--with-reference"]) == 0
    out = capsys.readouterr().out
    assert "softmax (reference)" in out and out.count("softmax") >= 2
    monkeypatch.setenv("MIXZOO_REFERENCE", str(tmp_path / "none"))
    assert main(["--results", str(tmp_path / "mine"), "leaderboard", "show", "--with-reference"]) == 0
    assert "no reference rows" in capsys.readouterr().err
