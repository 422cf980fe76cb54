"""Training-free test-time regression: data, the exact online shift, the evaluator, the command."""
import json

import torch

from mixzoo.cli import main as cli_main
from mixzoo.registry import mixers, tasks
from mixzoo.train.ttr import evaluate_ttr, online_predict


def leaky_core(q, k, v, *, w: float = 1.0):
    """A causal toy core: running mean of values plus w times the query (uses only j <= i)."""
    cs = v.cumsum(-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]
    return cs + w * q[..., : v.shape[-1]]


def test_data_segments_and_targets():
    t = tasks()["ttr"](d=4, L=64, S=16, noise=0.0)
    assert (t.kind, t.backbone) == ("training-free", "none")
    s = t.sample("test", 3, 0)
    seg = s["segment"][0]
    assert torch.equal(seg, torch.arange(4).repeat_interleave(16)), "segments in temporal order"
    want = torch.einsum("nlij,nlj->nli", s["A"][:, seg], s["k"])
    assert torch.allclose(s["clean"], want, atol=1e-6) and torch.allclose(s["v"], s["clean"])
    assert torch.allclose(s["k"].norm(dim=-1), torch.ones(3, 64))


def test_online_prediction_uses_only_earlier_pairs():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 12, 4, generator=g), torch.randn(2, 12, 4, generator=g)
    softmax = mixers()["softmax"].core
    for core in (softmax, leaky_core):
        base = online_predict(core, k, v)
        assert (base[:, 0] == 0).all()
        for i in range(1, 12):
            k2, v2 = k.clone(), v.clone()
            v2[:, i:] += 5.0                   # pair i's value and every later pair
            k2[:, i + 1:] += 5.0               # later keys (k_i is the query at i)
            p = online_predict(core, k2, v2)
            assert torch.allclose(p[:, : i + 1], base[:, : i + 1], atol=1e-5)
            if i < 11:
                assert not torch.allclose(p[:, i + 1:], base[:, i + 1:]), "later predictions do change"
    # the query at i is k_i: the running-mean core predicts mean(v_<i) + k_i
    p = online_predict(leaky_core, k, v)
    assert torch.allclose(p[:, 5], v[:, :5].mean(1) + k[:, 5], atol=1e-5)


def test_evaluator_tunes_picks_up_cores_and_reports():
    t = tasks()["ttr"](d=4, L=32, S=8)
    r = evaluate_ttr(t, mechanisms=["softmax", "toy", "random", "zero"], sequences=4, tune_sequences=2,
                     extra_cores={"toy": (leaky_core, {"w": [0.0, 1.0]})})
    assert set(r["mse"]) == {"softmax", "toy", "random", "zero"}
    assert r["best"]["toy"] == {"w": 0.0}, "tuning picks the better grid point"
    assert len(r["per_segment"]["toy"]) == 4 and len(r["per_position"]["toy"]) == 32
    assert r["mse"]["softmax"] < r["mse"]["zero"] < r["mse"]["random"]
    broken = evaluate_ttr(t, mechanisms=["bad"], sequences=2, tune_sequences=1,
                          extra_cores={"bad": (lambda q, k, v: 1 / 0, {})})
    assert "bad" in broken["skipped"]
    everything = evaluate_ttr(t, sequences=2, tune_sequences=1)
    assert {"softmax", "lla", "random", "zero"} <= set(everything["mse"])


def test_command_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "ttr.json"
    rc = cli_main(["ttr", "--dim", "4", "--seq-len", "32", "--segment", "8", "--sequences", "2",
                   "--tune-sequences", "1", "--mechanisms", "softmax,random", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "seg 0" in text and "softmax" in text and "random" in text
    data = json.loads(out.read_text())
    assert len(data[0]["per_position"]["softmax"]) == 32
    assert cli_main(["ttr", "--seq-len", "32", "--segment", "8,16", "--sequences", "2", "--tune-sequences", "1",
                     "--dim", "4", "--mechanisms", "softmax"]) == 0
    assert "S=16" in capsys.readouterr().out
    assert cli_main(["ttr", "--mechanisms", "nope", "--seq-len", "32", "--segment", "8"]) == 2
