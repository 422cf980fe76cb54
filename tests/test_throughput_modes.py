"""Step modes on the CPU: the config field, graphed's selection and fallback (CUDA graphs cannot be
captured here, so a graphed run is the eager one, unchanged, and says why), ``mixzoo bench
throughput``'s step-mode matrix at the tiny shape, the MAD projection, and the step profiler."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from mixzoo.cli import main
from mixzoo.errors import UsageError
from mixzoo.models import ModelConfig
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig, train
from mixzoo.train.graphed import Stepper, select_mode

ROOT = Path(__file__).resolve().parents[1]
TASK = MQAR(V=32, L=16, kv=2)
MCFG = ModelConfig(d_model=16, num_heads=2)
BASE = dict(steps=6, batch_size=4, eval_every=3, n_train=32, n_val=8, n_test=8, eval_batch_size=8)
TIMING = ("steps_per_s", "train_time_s")


pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py


def test_step_mode_field():
    assert TrainConfig().step_mode == "eager"
    with pytest.raises(UsageError, match="step_mode='fast'; allowed: eager, graphed, stacked, stacked"):
        TrainConfig(step_mode="fast")
    # how a step runs is not part of a configuration's identity (hparams_json groups by it)
    assert "step_mode" not in TrainConfig(step_mode="graphed").as_dict()


def test_graphed_selection_and_its_reasons():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert select_mode(TrainConfig(step_mode="graphed"), cuda) == ("graphed", "")
    assert select_mode(TrainConfig(), cuda) == ("eager", "")
    for cfg, dev, why in ((TrainConfig(step_mode="graphed"), cpu, "CUDA device"),
                          (TrainConfig(step_mode="graphed", compile="reduce-overhead"), cuda, "compile="),
                          (TrainConfig(step_mode="graphed", wd_anneal_gamma=2.0), cuda, "wd_anneal_gamma"),
                          (TrainConfig(step_mode="stacked"), cuda, None)):
        mode, reason = select_mode(cfg, dev)
        if why is None:
            assert mode == "stacked" and reason == ""
        else:
            assert mode == "eager" and why in reason
    assert select_mode(TrainConfig(step_mode="graphed"), cuda, callbacks=[object()])[0] == "eager"
    assert select_mode(TrainConfig(step_mode="graphed", optimizer="muon"), cuda) == ("graphed", "")


def test_graphed_on_the_cpu_is_the_eager_run_unchanged():
    logs: list[str] = []
    eager = train(TASK, "softmax", {}, MCFG, TrainConfig(**BASE), seed=1, device="cpu")
    graphed = train(TASK, "softmax", {}, MCFG, TrainConfig(step_mode="graphed", **BASE), seed=1, device="cpu",
                    log=logs.append)
    assert graphed.step_mode == "eager" and graphed.step_mode_reason == "CUDA graphs need a CUDA device"
    assert any("running eager: CUDA graphs need a CUDA device" in ln for ln in logs)
    strip = lambda h: [{k: v for k, v in x.items() if k not in TIMING} for x in h]      # noqa: E731
    assert strip(graphed.history) == strip(eager.history)          # bitwise: the same eager run
    assert graphed.test == eager.test and graphed.val == eager.val and graphed.steps == eager.steps


@pytest.mark.parametrize("mixer,extra", [("softmax", {}), ("gdn", {}),
                                         ("softmax", {"optimizer": "muon", "muon_lr": 2e-3, "warmup_frac": 0.3}),
                                         ("gdn", {"optimizer": "muon", "muon_lr": 2e-3, "warmup_frac": 0.3})])
def test_the_graphed_loop_run_eagerly_gives_the_eager_numbers(mixer, extra):
    """The graphed loop's own step (device step counter, schedule tables, fused AdamW with a tensor
    learning rate; with Muon, GraphMuon over the hidden matrices), run eagerly as it is on a CPU,
    against the Lightning run (torch.optim.Muon there): same losses, scores."""
    from mixzoo.train.graphed import train_graphed
    cfg = {**BASE, **extra}
    eager = train(TASK, mixer, {}, MCFG, TrainConfig(**cfg), seed=2, device="cpu")
    loop = train_graphed(TASK, mixer, {}, MCFG, TrainConfig(step_mode="graphed", **cfg), 2, torch.device("cpu"))
    assert loop.state == "COMPLETE" and loop.steps == eager.steps and loop.best_step == eager.best_step
    for a, b in zip(eager.history, loop.history):
        assert a["step"] == b["step"] and a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    assert loop.test["loss"] == pytest.approx(eager.test["loss"], rel=1e-5)


def test_graph_muon_is_torch_muon():
    """GraphMuon's update equals torch.optim.Muon's (match_rms_adamw, Nesterov) bitwise on the CPU,
    with the learning rate changed between steps through its tensor."""
    from mixzoo.train.optim import GraphMuon
    g0 = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(32, 16, generator=g0)), torch.nn.Parameter(torch.randn(8, 24, generator=g0))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ref = torch.optim.Muon(ps, lr=3e-3, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    lr = torch.tensor(3e-3, dtype=torch.float64)
    ours = GraphMuon(qs, lr=lr, weight_decay=0.1, momentum=0.95)
    for s in range(5):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=g0)
            q.grad = p.grad.clone()
        ref.param_groups[0]["lr"] = 3e-3 * (1 - 0.15 * s)
        lr.fill_(3e-3 * (1 - 0.15 * s))
        ref.step()
        ours.step()
        for p, q in zip(ps, qs):
            assert torch.equal(p, q), s
    with pytest.raises(ValueError, match="0-dim"):
        GraphMuon(qs, lr=3e-3, weight_decay=0.1)


def test_stepper_runs_eagerly_without_cuda():
    calls = []
    s = Stepper(lambda: calls.append(1), torch.device("cpu"), capture=True)
    for i in range(5):
        s.run(i)
    assert len(calls) == 5 and s.graph is None and not s.replayed and not s.capture


def test_bench_throughput_step_modes_tiny(tmp_path, capsys):
    out, md = tmp_path / "tp.json", tmp_path / "tp.md"
    assert main(["bench", "throughput", "--shape", "tiny", "softmax", "--modes", "stacked",
                 "--K", "2", "--procs", "2", "--pack", "stacked:2", "--steps", "4", "--warmup", "2",
                 "--out", str(out), "--md", str(md), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    cells = {(r["mode"], r["K"], r["P"]): r for r in res["rows"]}
    assert set(cells) == {("eager", 1, 1), ("stacked", 2, 1), ("stacked", 2, 2)}    # eager: always, the baseline
    for r in cells.values():
        assert r["state"] == "COMPLETE" and r["model_steps_per_s"] > 0 and r["backend"] == "sdpa", r
        assert r["ran"] == r["mode"] and r["peak_mem_bytes"] > 0
    assert 0 <= cells[("stacked", 2, 2)]["overlap"] <= 1
    assert "| tiny | softmax (sdpa) | eager | 1 | 1 |" in text and "1.00x" in text
    assert "| tiny | softmax (sdpa) | stacked | 2 | 2 |" in md.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_bench_throughput_times_a_variant_beside_its_mechanism(tmp_path, monkeypatch):
    """``NAME:KEY=V`` is a variant: its own rows (eager baseline included), its knobs reaching the
    model in process and in packed workers, labelled apart from the mechanism; the MIXZOO_ switches
    of the run are recorded."""
    out = tmp_path / "tp.json"
    monkeypatch.setenv("MIXZOO_FOLD_RMS_NORM", "1")
    assert main(["bench", "throughput", "--shape", "tiny", "mamba", "mamba:chunk_size=4", "--modes", "stacked",
                 "--K", "2", "--procs", "2", "--pack", "stacked:2", "--steps", "2", "--warmup", "2",
                 "--out", str(out), "--device", "cpu"]) == 0
    res = json.loads(out.read_text())
    assert res["env"] == {"MIXZOO_FOLD_RMS_NORM": "1"}
    rows = {(r["mixer"], r["mode"], r["P"]): r for r in res["rows"]}
    assert set(rows) == {(m, mode, P) for m in ("mamba", "mamba chunk_size=4")
                         for mode, P in (("eager", 1), ("stacked", 1), ("stacked", 2))}
    for (m, _, _), r in rows.items():
        assert r["state"] == "COMPLETE" and r["mechanism"] == "mamba", r
        assert r["knobs"] == ({"chunk_size": 4} if m != "mamba" else {})
    from mixzoo.bench.throughput import project_mad
    assert set(project_mad(res, shape="tiny")["hours"]) == {"mamba", "mamba chunk_size=4"}
    # an unknown knob: one line and exit 2 before anything is timed
    assert main(["bench", "throughput", "--shape", "tiny", "mamba:no_such_knob=1", "--device", "cpu"]) == 2


def test_bench_throughput_refuses_bad_cells():
    import argparse

    from mixzoo.bench import cli, throughput
    p = argparse.ArgumentParser()
    cli.configure("bench", p)
    for argv, msg in ((["--shape", "huge"], "shape 'huge'"), (["--shape", "tiny", "--modes", "fast"], "step mode 'fast'"),
                      (["--shape", "tiny", "--pack", "eager:4"], "K > 1 needs a stacked mode"),
                      (["--shape", "tiny", "--K", "x"], "integers")):
        with pytest.raises(UsageError, match=msg):
            throughput.main(p.parse_args(["throughput", *argv]))


def _synthetic_rates():
    rows = []
    for mixer, base in (("softmax", 100.0), ("gdn", 50.0)):
        for mode, K, P, x in (("eager", 1, 1, 1.0), ("graphed", 1, 1, 2.0), ("stacked", 8, 1, 6.0),
                              ("stacked+graphed", 8, 4, 12.0)):
            rows.append(dict(shape="mad", mixer=mixer, mode=mode, K=K, P=P, state="COMPLETE",
                             model_steps_per_s=base * x))
    rows.append(dict(shape="mqar512", mixer="softmax", mode="eager", K=1, P=1, state="COMPLETE", model_steps_per_s=1.0))
    rows.append(dict(shape="mad", mixer="gdn", mode="stacked", K=16, P=1, state="FAIL", model_steps_per_s=float("nan")))
    return {"device": "synthetic", "rows": rows}


def test_mad_projection_from_a_rates_file(tmp_path, capsys):
    from mixzoo.bench.throughput import mad_protocol, project_mad, projection_table
    work = 66 * (6 + 3) * 20_000 * 2.3          # the README's projection: softmax at 101.5 steps/s -> 74.8 h
    assert mad_protocol() == pytest.approx(work)
    assert work / 101.5 / 3600 == pytest.approx(74.8, abs=0.05)
    assert 1.0 < mad_protocol("settings") / (66 * 9 * 20_000) < 2.3      # each setting's own length and size
    p = project_mad(_synthetic_rates())
    assert p["hours"]["softmax"]["eager"] == pytest.approx(work / 100 / 3600)
    assert p["hours"]["gdn"]["stacked+graphed K=8 x 4 procs"] == pytest.approx(work / 600 / 3600)
    assert "stacked K=16" not in p["hours"]["gdn"]                 # failed cells are left out
    assert p["best_cell"]["gdn"] == "stacked+graphed K=8 x 4 procs"
    assert p["total"]["eager"] == pytest.approx(work / 3600 * (1 / 100 + 1 / 50))
    assert p["total_best"] == pytest.approx(work / 3600 * (1 / 1200 + 1 / 600))
    text = projection_table(p)
    assert "| softmax |" in text and "| all |" in text and "fastest" in text
    assert p["over_stacked"] == ["stacked+graphed K=8 x 4 procs"] and "Note: stacked+graphed K=8 x 4 procs" in text
    assert project_mad(_synthetic_rates(), trials=8)["over_stacked"] == []
    f = tmp_path / "rates.json"
    f.write_text(json.dumps(_synthetic_rates()))
    assert main(["bench", "throughput", "--project", str(f), "--md", str(tmp_path / "p.md")]) == 0
    assert "| gdn |" in capsys.readouterr().out and (tmp_path / "p.md").exists()
    assert math.isfinite(project_mad(f, variant="settings")["hours"]["softmax"]["eager"])


def test_mad_projection_as_a_sweep_runs_a_study():
    """Trials at the K = trials rate, then seeds at the K = seeds rate: 6/9 and 3/9 of the work."""
    from mixzoo.bench.throughput import mad_protocol, project_mad, projection_table
    rows = [dict(shape="mad", mixer="gdn", mode="stacked+graphed", K=K, P=1, state="COMPLETE", model_steps_per_s=v)
            for K, v in ((16, 500.0), (6, 400.0), (3, 250.0))]
    rows.append(dict(shape="mad", mixer="softmax", mode="stacked+graphed", K=16, P=1, state="COMPLETE",
                     model_steps_per_s=1000.0))
    p = project_mad({"rows": rows})
    cell = "sweep: stacked+graphed K=6, then K=3"
    work = mad_protocol()
    assert p["hours"]["gdn"][cell] == pytest.approx((work * 6 / 9 / 400 + work * 3 / 9 / 250) / 3600)
    assert cell not in p["hours"]["softmax"] and not math.isfinite(p["total"][cell])    # softmax lacks K = 6, 3
    assert p["best_cell"]["gdn"] == "stacked+graphed K=16" and cell in projection_table(p)
    assert cell.replace("K=6", "K=4") in project_mad({"rows": rows + [
        dict(rows[1], K=4)]}, trials=4)["hours"]["gdn"]


def test_mad_projection_counts_the_runs_the_paper_scale_trains():
    """The settings work model is the parallax-mad figure's paper scale: MAD's 66 settings at their lengths, 200
    epochs at batch 128 (as many steps as that scale's runs take), validation every eval_every steps and after the
    last; what the hours leave out (the validation and test passes, forward only) is counted beside them."""
    from mixzoo.bench.throughput import mad_eval_work, mad_paper_runs, mad_setting_steps
    from mixzoo.reproduce.parallax import MAD
    from mixzoo.tasks.mad import MAD_SETTINGS
    runs = mad_paper_runs()
    settings = [st for sts in MAD_SETTINGS.values() for st in sts]
    assert len(runs) == len(settings) == 66
    assert sorted(r["L"] for r in runs) == sorted(st["L"] for st in settings)
    assert sorted(r["steps"] for r in runs) == sorted(200 * st["n_train"] // 128 for st in settings)
    assert [s["steps"] for s in MAD.scale("paper").settings] == [r["steps"] for r in runs]
    r = next(r for r in runs if r["steps"] == 1250)                 # 800 examples: eval_every 62, 20 x 62 = 1240
    assert (r["evals"], r["n_val"], r["n_test"], r["batch_size"]) == (21, 1280, 1280, 128)
    assert max(r["steps"] for r in mad_paper_runs(steps=1000)) == 1000
    assert sum(n for _, n in mad_setting_steps()) == 9 * sum(r["steps"] for r in runs)
    e = mad_eval_work(trials=1, seeds=0)
    assert e["runs"] == 66 and e["passes"] == sum(r["evals"] + 1 for r in runs)
    assert e["eval_sequences"] == pytest.approx(sum((r["evals"] + 1) * 1280 * r["L"] / 128 for r in runs))
    assert e["train_sequences"] == pytest.approx(sum(r["steps"] * 128 * r["L"] / 128 for r in runs))
    assert 0.005 < e["share"] < 0.05 and mad_eval_work()["share"] == pytest.approx(e["share"])


def test_validation_times_give_the_passes_hours_beside_the_projection(tmp_path, capsys):
    """--validation: validation_time.py's ms a pass at 128 and 1024, read off at each setting's length, times each
    setting's passes (validations and the test pass, 9 runs each); shown, not added; another card is refused."""
    from mixzoo.bench.throughput import mad_paper_runs, project_mad, projection_table, step_time_at, validation_hours
    rates = {"device": "GPU X", "rows": [dict(shape=n, mixer="gdn", mode="stacked+graphed", K=6, P=1, state="COMPLETE",
                                               model_steps_per_s=r) for n, r in (("mad", 100.0), ("mad1024", 10.0))]}
    rows = [dict(mixer="gdn", shape="mad", card="GPU X", models_ms=30.0, vmapped_ms=10.0),
            dict(mixer="gdn", shape="mad1024", card="GPU X", models_ms=120.0, vmapped_ms=60.0),
            dict(mixer="gdn", shape="tiny", card="GPU X", models_ms=1e6, vmapped_ms=1e6)]   # not a MAD length
    h = validation_hours(rows, "GPU X")["gdn"]
    for path, pts in (("models_ms", {128: 0.030, 1024: 0.120}), ("vmapped_ms", {128: 0.010, 1024: 0.060})):
        want = sum(9 * (r["evals"] + 1) * step_time_at(pts, r["L"])[0] for r in mad_paper_runs()) / 3600
        assert h[path] == pytest.approx(want)
    assert h["models_ms"] > h["vmapped_ms"] > 0
    f = tmp_path / "v.json"
    f.write_text(json.dumps(rows))
    p = project_mad(rates, variant="settings", validation=f)
    assert p["validation"]["gdn"] == pytest.approx(h)
    assert p["total_best"] == pytest.approx(project_mad(rates, variant="settings")["total_best"])   # not added
    text = projection_table(p)
    assert "| mechanism | fastest cell | validation, one model at a time | validation, vmapped |" in text
    assert f"| gdn | {p['best']['gdn']:.1f} | {h['models_ms']:.2f} | {h['vmapped_ms']:.2f} |" in text
    with pytest.raises(UsageError, match="measured on GPU Y, the rates on GPU X"):
        project_mad(rates, variant="settings", validation=[dict(r, card="GPU Y") for r in rows])
    r = tmp_path / "r.json"
    r.write_text(json.dumps(rates))
    assert main(["bench", "throughput", "--project", str(r), "--protocol", "settings", "--validation", str(f)]) == 0
    assert "validation, vmapped" in capsys.readouterr().out
    assert main(["bench", "throughput", "--project", str(r), "--validation", str(f)]) == 2     # readme protocol
    assert main(["bench", "throughput", "--project", str(r), "--protocol", "settings", "--validation",
                 str(tmp_path / "none.json")]) == 2
    assert "--validation: no file" in capsys.readouterr().err


def test_mad_projection_reads_each_setting_s_step_time_at_its_length(tmp_path):
    """--protocol settings: a setting at a measured length takes that length's step time, one between two
    measured lengths the linear interpolation, one outside them the nearest's scaled linearly in L."""
    from mixzoo.bench.throughput import (
        MAD_LENGTHS,
        MODE_SHAPES,
        _dims,
        mad_protocol,
        mad_setting_steps,
        project_mad,
        projection_table,
        step_time_at,
    )
    assert {n: _dims(n)[1] for n in MAD_LENGTHS} == {"mad": 127, "mad32": 31, "mad64": 63, "mad256": 255,
                                                     "mad512": 511, "mad1024": 1023}
    assert all(MODE_SHAPES[n]["recipe"] == "mad" and MODE_SHAPES[n]["batch_size"] == 128 for n in MAD_LENGTHS)
    pts = {128: 0.01, 256: 0.025, 1024: 0.2}
    assert step_time_at(pts, 256) == (0.025, False)
    assert step_time_at(pts, 512) == (pytest.approx(0.025 + (512 - 256) / (1024 - 256) * (0.2 - 0.025)), False)
    assert step_time_at(pts, 64) == (pytest.approx(0.005), True)     # the line through 128 and 256 is lower
    # below the shortest length: the line through the two shortest where it is above scaling in L (a fixed part)
    assert step_time_at({128: 0.01, 256: 0.015}, 64) == (pytest.approx(0.0075), True)
    assert step_time_at({128: 0.01}, 64) == (pytest.approx(0.005), True)
    assert step_time_at(pts, 2048) == (pytest.approx(0.4), True)
    rates = {128: 100.0, 256: 40.0, 1024: 5.0}
    shape_of = {L: n for n, L in MAD_LENGTHS.items()}
    rows = [dict(shape=shape_of[L], mixer="gdn", mode="stacked+graphed", K=K, P=1, state="COMPLETE",
                 model_steps_per_s=r * (1.0 if K == 6 else 0.5)) for L, r in rates.items() for K in (6, 3)]
    only_base = [dict(shape="mad", mixer="softmax", mode="stacked+graphed", K=6, P=1, state="COMPLETE",
                      model_steps_per_s=200.0)]
    # the rows of two files together
    f1, f2 = tmp_path / "a.json", tmp_path / "b.json"
    f1.write_text(json.dumps({"device": "synthetic", "rows": rows[:2] + only_base}))
    f2.write_text(json.dumps({"rows": rows[2:]}))
    p = project_mad([f1, f2], variant="settings")
    per = mad_setting_steps()
    expect = sum(n * step_time_at({L: 1 / r for L, r in rates.items()}, L)[0] for L, n in per) / 3600
    assert p["hours"]["gdn"]["stacked+graphed K=6"] == pytest.approx(expect)
    assert p["lengths"]["gdn"]["stacked+graphed K=6"] == [128, 256, 1024]
    outside = sum(n * L / 128 for L, n in per if L < 128) / mad_protocol("settings")
    assert p["outside_share"]["gdn"]["stacked+graphed K=6"] == pytest.approx(outside) and 0 < outside < 0.05
    # the sweep column: 6/9 of each setting's runs at K = 6's time there, 3/9 at K = 3's (half the rate)
    assert p["hours"]["gdn"]["sweep: stacked+graphed K=6, then K=3"] == pytest.approx(expect * (6 / 9 + 3 / 9 * 2))
    # a cell measured at the baseline alone is the linear model: the old projection
    assert p["hours"]["softmax"]["stacked+graphed K=6"] == pytest.approx(mad_protocol("settings") / 200 / 3600)
    assert p["outside_share"]["softmax"]["stacked+graphed K=6"] > 0.7
    assert p["device"] == "synthetic"
    text = projection_table(p)
    assert "lengths 128, 256, 1024 (stacked+graphed K=6: gdn" in text and "lengths 128 (" in text
    # where the hours go: by the settings' length, at the fastest cell (gdn's: the sweep column is slower here)
    assert p["best_cell"]["gdn"] == "stacked+graphed K=6"
    assert sum(p["by_length"]["gdn"].values()) == pytest.approx(p["best"]["gdn"])
    assert p["by_length"]["gdn"][1024] == pytest.approx(sum(n for L, n in per if L == 1024) / 5.0 / 3600)
    assert sorted(p["by_length"]["gdn"]) == sorted({L for L, _ in per})
    assert "Device-hours by the settings' length" in text and "| 32 | 64 | 128 | 256 | 512 | 1024 | all |" in text
    assert p["eval_work"]["runs"] == 66 * 9 and "validation passes" in text and "% as many sequences" in text
    # the README work model reads the baseline only; a longer length alone projects nothing
    assert project_mad([f1, f2])["hours"]["gdn"]["stacked+graphed K=6"] == pytest.approx(mad_protocol() / 100 / 3600)
    assert "gdn" not in project_mad({"rows": rows[2:]}, variant="settings")["hours"]
    assert main(["bench", "throughput", "--project", str(f1), str(f2), "--protocol", "settings"]) == 0
    # the fastest cell is one measured at the most lengths, not a faster baseline-only one
    k16 = dict(shape="mad", mixer="gdn", mode="stacked+graphed", K=16, P=1, state="COMPLETE", model_steps_per_s=1e4)
    p = project_mad({"rows": rows + [k16]}, variant="settings")
    assert p["hours"]["gdn"]["stacked+graphed K=16"] < p["hours"]["gdn"]["stacked+graphed K=6"]
    assert p["best_cell"]["gdn"] == "stacked+graphed K=6"
    assert project_mad({"rows": rows + [k16]})["best_cell"]["gdn"] == "stacked+graphed K=16"
    # the short settings measured (launch-bound: here as slow a step as the baseline's): no work outside, and the
    # hours grow by what the linear model had left out
    short = [dict(rows[0], shape=n, model_steps_per_s=100.0) for n in ("mad32", "mad64")]
    p = project_mad({"rows": rows[::2] + short}, variant="settings")
    assert p["outside_share"]["gdn"]["stacked+graphed K=6"] == 0.0
    assert p["lengths"]["gdn"]["stacked+graphed K=6"] == [32, 64, 128, 256, 1024]
    assert p["hours"]["gdn"]["stacked+graphed K=6"] == pytest.approx(expect + sum(
        n * (1 / 100 - L / 128 / 100) for L, n in per if L < 128) / 3600)


def test_validation_time_times_the_stacked_run_s_own_validations_on_the_cpu():
    spec = importlib.util.spec_from_file_location("validation_time", ROOT / "benchmarks" / "validation_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.measure("softmax", "tiny", K=2, n_val=16, eval_batch=8, reps=2, device="cpu")
    assert r["validations"] == [6, 6]       # each path: a warm-up round and two timed ones, each model
    assert r["models_ms"] > 0 and r["vmapped_ms"] > 0 and r["card"] == "cpu"


def test_layer_bytes_counts_a_layer_on_the_cpu():
    spec = importlib.util.spec_from_file_location("layer_bytes", ROOT / "benchmarks" / "layer_bytes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    backend, by, calls, outs = mod.count("mamba", batch=2)
    assert backend == "torch-chunk" and sum(by.values()) > 0 and calls["bmm"] > 0
    assert not set(by) & mod.VIEWS                      # views write nothing and are not counted
    assert sum(n for n, *_ in outs) == sum(by.values())


def test_profile_step_runs_on_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("profile_step", ROOT / "benchmarks" / "profile_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--shape", "tiny", "--mixers", "softmax", "--stacked", "2", "--steps", "1", "--warmup", "1",
                     "--top", "4", "--device", "cpu", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "profile_step.md").read_text()
    assert "softmax (sdpa), eager, shape tiny" in md and "stacked K=2" in md and "`aten::" in md
    res = json.loads((tmp_path / "profile_step.json").read_text())["results"]
    assert all(r["kind"] == "cpu" and r["ops_per_step"] > 0 and len(r["top"]) == 4 for r in res.values())
    # --by-source names the Python lines behind the operators (the stacks were empty without the verbose config)
    assert mod.main(["--shape", "tiny", "--mixers", "softmax", "--steps", "1", "--warmup", "1", "--top", "30",
                     "--device", "cpu", "--by-source", "--out", str(tmp_path)]) == 0
    (r,) = json.loads((tmp_path / "profile_step.json").read_text())["results"].values()
    named = [t["name"] for t in r["top_sources"] if not t["name"].endswith("(other)")]
    assert any("softmax.py" in n for n in named), r["top_sources"]


def test_a_packed_cell_names_every_worker_s_backend():
    """A packed cell's workers are separate processes; one that took another path (on the H200 a gdn
    worker ran the PyTorch dqkwg step) must show in the row, not only the first worker's backend."""
    from mixzoo.bench.throughput import packed_row
    w = lambda b, t0: dict(backend=b, state="COMPLETE", ran="stacked+graphed", note="", model_steps_per_s=10.0,  # noqa: E731
                           peak_mem_bytes=5, t_first=t0, t_last=t0 + 10)
    same = packed_row({"P": 2}, [w("fla-chunk+triton-dqkwg", 0), w("fla-chunk+triton-dqkwg", 5)])
    assert same["backend"] == "fla-chunk+triton-dqkwg" and same["note"] == ""
    assert same["model_steps_per_s"] == 20.0 and same["peak_mem_bytes"] == 10 and same["overlap"] == 0.5
    mixed = packed_row({"P": 2}, [w("fla-chunk+triton-dqkwg", 0), w("fla-chunk+torch-dqkwg", 0)])
    assert mixed["backend"] == "fla-chunk+torch-dqkwg|fla-chunk+triton-dqkwg"
    assert "workers ran different backends" in mixed["note"]


def test_step_bytes_attributes_a_whole_step_on_the_cpu():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import step_bytes
    r = step_bytes.count("softmax", batch=4)
    by = r["bytes"]
    for key in ("fwd mixer", "bwd mixer", "fwd mlp", "bwd mlp", "fwd norm1", "bwd norm1", "loss", "clip + optimizer"):
        assert by.get(key, 0) > 0, (key, by)
    assert by.get("?", 0) == 0                         # every operator ran inside a known module or phase


def test_step_bytes_counts_the_backbone_kernels_as_their_outputs():
    """``step_bytes.py --kernels`` (Triton's interpreter): each of mixzoo's kernels (the backbone's, softmax attention's) is one
    operator writing its outputs; the step writes less than with the PyTorch forms."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    pytest.importorskip("triton")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "step_bytes.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIXZOO_")}
    runs = {}
    for flag, extra in (("--kernels", {"TRITON_INTERPRET": "1"}), (None, {})):
        p = subprocess.run([sys.executable, str(script), "softmax", "--batch", "2", "--top", "30",
                            *([flag] if flag else [])], capture_output=True, text=True, env={**env, **extra},
                           timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        runs[flag] = p.stdout
    head = lambda out: out.splitlines()[0]                                          # noqa: E731
    assert "mixzoo kernels" in head(runs["--kernels"]) and "mixzoo kernels" not in head(runs[None])
    mib = lambda out: float(head(out).split(" operators, ")[1].split(" MiB")[0])   # noqa: E731
    ops = lambda out: int(head(out).split(": ")[1].split(" operators")[0])          # noqa: E731
    assert mib(runs["--kernels"]) < mib(runs[None]) and ops(runs["--kernels"]) < ops(runs[None])
    norm = [ln for ln in runs["--kernels"].splitlines() if ln.strip().startswith("fwd norm1")]
    assert norm and int(norm[0].split()[2]) <= 2, runs["--kernels"]               # one launch (and its output's use)


def test_a_projection_refuses_rates_from_two_kinds_of_device(tmp_path):
    """Rates measured on an H100 and on an H200 are not mixed in one projection: one line, exit 2."""
    from mixzoo.bench.throughput import project_mad
    a, b = _synthetic_rates(), _synthetic_rates()
    a["device"], b["device"] = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    with pytest.raises(UsageError, match="measured on NVIDIA H100 80GB HBM3 and NVIDIA H200"):
        project_mad([a, b])
    assert project_mad([a, dict(a)])["device"] == "NVIDIA H100 80GB HBM3"      # one kind: fine
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    assert main(["bench", "throughput", "--project", str(fa), str(fb)]) == 2



def test_mad_projection_of_mad_s_own_protocol(tmp_path, capsys):
    """``--seeds 0``: MAD's own protocol (each setting's 6 search runs, the best reported, no re-run seeds) is 6/9 of
    mixzoo's (6 trials and 3 seeds) in every cell, and has no 'sweep:' cell; bad counts are refused (exit 2)."""
    from mixzoo.bench.throughput import project_mad
    f = tmp_path / "rates.json"
    f.write_text(json.dumps(_synthetic_rates()))
    full, own = project_mad(f, variant="settings"), project_mad(f, variant="settings", seeds=0)
    for m, cells in full["hours"].items():
        for c, h in cells.items():
            assert own["hours"][m][c] == pytest.approx(h * 6 / 9)
    assert main(["bench", "throughput", "--project", str(f), "--protocol", "settings", "--seeds", "0"]) == 0
    out = capsys.readouterr().out
    assert "| softmax |" in out and "sweep:" not in out
    for bad in (["--seeds", "-1"], ["--trials", "0"]):
        assert main(["bench", "throughput", "--project", str(f), *bad]) == 2
        assert "--trials must be >= 1" in capsys.readouterr().err
    assert main(["bench", "throughput", "--shape", "tiny", "--seeds", "0"]) == 2      # counts without --project
    assert "with throughput --project only" in capsys.readouterr().err
