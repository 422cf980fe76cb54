"""Optimizers and schedules (mixzoo.train.optim): which tensors Muon gets, AdamW unchanged, Muon
trains, the WSD and weight-decay-annealing shapes, and mechanism diagnostics recorded by the trainer."""
from __future__ import annotations

import math

import pytest
import torch

from mixzoo.api import make_task, split_hparams
from mixzoo.cli import main
from mixzoo.models import ModelConfig, build_model
from mixzoo.models.parallax import Parallax
from mixzoo.train import TrainConfig, train
from mixzoo.train.optim import Combined, build_optimizer, lr_lambda, split_params, wd_multiplier


def _names(pairs):
    return {n for n, _ in pairs}


def test_muon_gets_the_hidden_matrices_only():
    model = build_model("lm", "gdn", {}, ModelConfig(d_model=32, num_heads=2, n_layers=2, mlp="swiglu",
                                                      short_conv=3), vocab=50)
    muon, adamw = split_params(model)
    assert all(p.dim() == 2 for _, p in muon)
    assert "embed.weight" in _names(adamw) and "embed.weight" not in _names(muon)   # tied head = embedding
    assert {"trunk.blocks.0.mixer.proj.weight", "trunk.blocks.0.mixer.o_proj.weight",
            "trunk.blocks.1.mlp.fc1.weight", "trunk.blocks.1.mlp.fc2.weight"} <= _names(muon)
    # norms, biases, per-head scalars and convolution kernels (3-D) stay with AdamW
    assert {"trunk.blocks.0.mixer.A_log", "trunk.blocks.0.mixer.dt_bias", "trunk.blocks.0.norm1.weight",
            "trunk.conv.conv.weight", "trunk.blocks.0.mixer.conv.conv.conv.weight"} <= _names(adamw)
    every = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for _, p in muon} | {id(p) for _, p in adamw} == every
    assert not {id(p) for _, p in muon} & {id(p) for _, p in adamw}


def test_untied_head_and_vector_read_in_out_stay_with_adamw():
    lm = build_model("lm", "softmax", {}, ModelConfig(d_model=16, num_heads=2, tie_embeddings=False), vocab=20)
    muon, adamw = split_params(lm)
    assert {"embed.weight", "head.weight"} <= _names(adamw) and not {"embed.weight", "head.weight"} & _names(muon)
    vec = build_model("vector", "softmax", {}, ModelConfig(d_model=16, num_heads=2), d_in=3, d_out=2)
    muon, adamw = split_params(vec)
    assert {"read_in.weight", "read_out.weight"} <= _names(adamw) and _names(muon)


def _old_groups(model, wd):   # the trainer's AdamW groups before the optimizer became a choice
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def _old_schedule(cfg):
    warm = max(1, int(cfg.warmup_frac * cfg.steps))

    def f(step):
        if step < warm:
            return (step + 1) / warm
        p = min(1.0, (step - warm) / max(1, cfg.steps - warm))
        return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def test_adamw_and_cosine_unchanged_in_numbers():
    cfg = TrainConfig(steps=30, lr=3e-3, weight_decay=0.1, warmup_frac=0.1, min_lr_frac=0.1)
    torch.manual_seed(0)
    a = build_model("lm", "gla", {}, ModelConfig(d_model=16, num_heads=2), vocab=30)
    b = build_model("lm", "gla", {}, ModelConfig(d_model=16, num_heads=2), vocab=30)
    b.load_state_dict(a.state_dict())
    new = build_optimizer(a, cfg, fused=False)
    old = torch.optim.AdamW(_old_groups(b, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98))
    s_new = torch.optim.lr_scheduler.LambdaLR(new, lr_lambda(cfg))
    s_old = torch.optim.lr_scheduler.LambdaLR(old, _old_schedule(cfg))
    x = torch.randint(0, 30, (4, 12))
    for _ in range(cfg.steps):
        for m, opt, sched in ((a, new, s_new), (b, old, s_old)):
            opt.zero_grad()
            m(x).float().logsumexp(-1).mean().backward()
            opt.step()
            sched.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


def test_wsd_schedule_and_weight_decay_annealing():
    cfg = TrainConfig(steps=100, schedule="wsd", warmup_frac=0.1, decay_frac=0.2, min_lr_frac=0.0,
                      wd_anneal_gamma=2.0)
    f = lr_lambda(cfg)
    assert [f(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])            # linear warm-up
    assert all(f(s) == 1.0 for s in range(10, 81))                                 # stable
    assert [f(s) for s in (85, 90, 100)] == pytest.approx([0.75, 0.5, 0.0])        # linear decay
    assert all(wd_multiplier(cfg, s) == 1.0 for s in range(0, 81))
    assert [wd_multiplier(cfg, s) for s in (85, 90, 100)] == pytest.approx([0.5625, 0.25, 0.0])  # (1 - t)^2
    assert wd_multiplier(TrainConfig(steps=100, schedule="wsd"), 95) == 1.0        # no annealing asked
    cos = lr_lambda(TrainConfig(steps=100, warmup_frac=0.1, min_lr_frac=0.0))
    assert cos(10) == pytest.approx(1.0) and cos(55) == pytest.approx(0.5) and cos(100) == pytest.approx(0.0)


def test_combined_optimizer_shares_groups_with_its_parts():
    m = build_model("lm", "softmax", {}, ModelConfig(d_model=16, num_heads=2), vocab=20)
    opt = build_optimizer(m, TrainConfig(optimizer="muon", lr=1e-2, weight_decay=0.1), fused=False)
    assert isinstance(opt, Combined)
    kinds = [type(o).__name__ for o in opt.optimizers]
    assert kinds == ["Muon", "AdamW"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    assert all(g["lr"] == pytest.approx(5e-3) for o in opt.optimizers for g in o.param_groups)
    m(torch.randint(0, 20, (2, 8))).sum().backward()
    opt.step()
    sched.step()
    state = opt.state_dict()
    assert len(state["optimizers"]) == 2 and state["optimizers"][0]["state"]
    opt.load_state_dict(state)


def _run(model, **hp):
    task = make_task("mqar", preset="demo")
    base = dict(steps=150, batch_size=32, lr=1e-2, weight_decay=0.1, warmup_frac=0.05, eval_every=50, d_model=32,
                num_heads=2, n_layers=2, short_conv=3, n_train=150 * 32, n_val=128, n_test=128)
    tcfg, mcfg, mix = split_hparams({**base, **hp}, "based")
    return train(task, model, mix, mcfg, tcfg, seed=0, device="cpu")


def test_muon_trains_the_demo_task():
    # 300 steps: measured 2.90 -> 0.29 training loss and test accuracy 0.91 (AdamW at this budget and
    # learning rate: 0.26; chance is 1 in 16 values)
    res = _run("softmax", optimizer="muon", schedule="wsd", wd_anneal_gamma=2.0, steps=300, n_train=300 * 32)
    assert res.state == "COMPLETE"
    first, last = res.history[0], res.history[-1]
    assert last["train_loss"] < 0.5 * first["train_loss"], res.history
    assert res.test["accuracy"] > 0.6, res.test


@pytest.mark.parametrize("model", ["lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena", "linear"])
def test_muon_steps_every_mechanism(model):
    """Every built-in mechanism trains a few steps under Muon: each hidden matrix in Muon's group, the
    rest in AdamW's, the loss finite at every validation."""
    task = make_task("mqar", preset="demo")
    tcfg, mcfg, mix = split_hparams(dict(steps=3, batch_size=4, lr=1e-2, eval_every=3, d_model=16, num_heads=2,
                                         n_layers=1, n_train=12, n_val=8, n_test=8, optimizer="muon"), "zoology")
    built = build_model(task.backbone, model, mix, mcfg, vocab=task.vocab_size)
    muon, adamw = split_params(built)
    assert muon and all(p.dim() == 2 for _, p in muon)
    assert any(".mixer." in n for n, _ in muon), [n for n, _ in muon]     # the mechanism's own matrices
    res = train(task, model, mix, mcfg, tcfg, seed=0, device="cpu")
    assert res.state == "COMPLETE" and all(math.isfinite(h["train_loss"]) for h in res.history), res.reason


def test_parallax_diagnostics_recorded_at_each_validation():
    res = _run("parallax", steps=40, eval_every=20, n_train=40 * 32, gate_r=True)
    assert res.state == "COMPLETE" and len(res.history) == 2
    for h in res.history:
        for layer in (0, 1):
            assert h[f"diag/layer{layer}/correction_ratio"] >= 0
            assert 1 <= h[f"diag/layer{layer}/stable_rank_WR"] <= 32
            assert 0 < h[f"diag/layer{layer}/gate_r"] < 1
    assert res.diagnostics == {k[5:]: v for k, v in res.history[-1].items() if k.startswith("diag/")}


def test_parallax_diagnostics_values():
    torch.manual_seed(0)
    m = Parallax(16, num_heads=2)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        m.r_proj.weight.zero_()                    # W_R = 0: exactly softmax attention, no correction
    assert float(m.diagnostics(x)["correction_ratio"]) == 0.0
    with torch.no_grad():
        m.r_proj.weight.copy_(torch.linalg.qr(torch.randn(16, 16))[0])
    d = m.diagnostics(x)
    assert float(d["stable_rank_WR"]) == pytest.approx(16.0, rel=1e-4)   # orthogonal: every direction
    assert float(d["correction_ratio"]) > 0 and "gate_r" not in d


def test_optimizer_flags_and_bad_values(tmp_path, capsys):
    assert main(["--results", str(tmp_path), "run", "mqar", "--model", "softmax", "--preset", "demo",
                 "--hp", "optimizer=sgd"]) == 2
    assert "optimizer='sgd'; allowed: adamw, muon" in capsys.readouterr().err
    assert main(["--results", str(tmp_path), "run", "mqar", "--model", "softmax", "--preset", "demo",
                 "--hp", "wd_anneal_gamma=-1"]) == 2
    assert not any(tmp_path.iterdir())


def test_optimizer_is_a_compare_axis_and_a_row_column(tmp_path, capsys):
    from test_sweeps_helpers import rows
    res = tmp_path / "res"
    argv = ["--results", str(res), "--device", "cpu", "compare", "mqar", "--models", "softmax", "--axis",
            "optimizer=adamw,muon", "--preset", "smoke", "--set", "L=32", "--trials", "1", "--seeds", "1",
            "--out", str(tmp_path / "opt.png")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "optimizer=adamw" in text and "optimizer=muon" in text
    lb = rows(res)
    assert sorted(r["optimizer"] for r in lb) == ["adamw", "muon"]
    assert all(r["schedule"] == "cosine" for r in lb) and len({r["study"] for r in lb}) == 2


def test_spec_searches_or_fixes_the_optimizer(tmp_path):
    from mixzoo.sweeps.spec import load

    def write_spec(d, name, text):
        (d / f"{name}.toml").write_text(text)
        return d / f"{name}.toml"
    searched = load(str(write_spec(tmp_path, "searched", '''
models = ["parallax"]
trials = 2
[train]
steps = 10
schedule = "wsd"
[search.parallax]
optimizer = ["cat", ["adamw", "muon"]]
[tasks.mqar]
preset = "demo"
''')))
    fixed = load(str(write_spec(tmp_path, "fixed", '''
models = ["parallax"]
trials = 2
[train]
steps = 10
optimizer = "muon"
[tasks.mqar]
preset = "demo"
''')))
    (u,), (v,) = searched.units, fixed.units
    assert u.space["optimizer"] == ("cat", ["adamw", "muon"]) and "lr" in u.space and u.fixed["schedule"] == "wsd"
    assert v.fixed["optimizer"] == "muon" and "optimizer" not in v.space
    assert u.study != v.study


def test_report_shows_the_diagnostics(tmp_path):
    from mixzoo.api import run
    from mixzoo.leaderboard.report import build_report
    run("mqar", "parallax", preset="demo", hparams=dict(steps=6, eval_every=3, batch_size=8, n_train=48, n_val=16,
                                                         n_test=16, d_model=16, optimizer="muon"),
        results=tmp_path, device="cpu")
    page = build_report(tmp_path).read_text()
    assert 'id="diagnostics"' in page and "layer1/correction_ratio" in page and "<td>muon</td>" in page
