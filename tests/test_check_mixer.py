"""``mixzoo check-mixer`` and ``mixzoo bench mixers`` from the command line."""
from __future__ import annotations

import json

import pytest

from mixzoo.check import check_mixer
from mixzoo.cli import main

LEAKY = '''
import torch
from torch import nn
from mixzoo.registry import register_mixer

@register_mixer("leaky", search_space={"lr": ("log", 1e-4, 3e-2)})
class Leaky(nn.Module):
    """Sees the future (a reversed cumulative sum) and has a parameter it never uses."""
    def __init__(self, d_model, *, num_heads=2, layer_idx=0):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.unused = nn.Linear(d_model, d_model)
        self.backend = "torch"
    def forward(self, x):
        return self.proj(x.flip(1).cumsum(1).flip(1))
'''


def test_check_mixer_cli_passes_a_builtin(capsys):
    assert main(["check-mixer", "linear"]) == 0
    out = capsys.readouterr().out
    assert "pass  causal" in out and "all 1 passed" in out and "skip  fast-vs-ref    no GPU" in out


def test_check_mixer_names_the_failures_of_a_broken_plugin(tmp_path, capsys):
    plugin = tmp_path / "leaky.py"
    plugin.write_text(LEAKY)
    assert main(["--plugin", str(plugin), "check-mixer", "leaky"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  causal" in out and "FAIL  gradients" in out and "unused.weight" in out
    bad = {r.check for r in check_mixer("leaky") if not r.ok}
    assert bad == {"causal", "gradients"}


def test_check_mixer_unknown_name_is_a_usage_error(capsys):
    assert main(["check-mixer", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_bench_mixers_quick_covers_every_mechanism(tmp_path, capsys, monkeypatch):
    import mixzoo.bench.mixers as bm
    monkeypatch.setitem(bm.QUICK, "seq_len", 16)
    monkeypatch.setitem(bm.QUICK, "iters", 1)
    out = tmp_path / "bench.json"
    assert main(["bench", "mixers", "--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    names = {r["mechanism"] for r in rows}
    assert {"lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena", "linear"} <= names
    assert all(r["ms"] > 0 and r["backend"] for r in rows)
    assert "fwd+bwd ms" in capsys.readouterr().out


def test_bench_mixers_named_mechanisms_and_variants(tmp_path, capsys, monkeypatch):
    import mixzoo.bench.mixers as bm
    monkeypatch.setitem(bm.QUICK, "seq_len", 16)
    monkeypatch.setitem(bm.QUICK, "iters", 1)
    out = tmp_path / "bench.json"
    assert main(["bench", "mixers", "--quick", "linear", "mamba:allow_neg_eigval=true,d_state=8",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mechanism"], r.get("knobs")) for r in rows] == [
        ("linear", None), ("mamba", {"allow_neg_eigval": True, "d_state": 8})]
    assert "mamba allow_neg_eigval=True d_state=8" in capsys.readouterr().out
    # a knob the mechanism does not take is bad input: one line, exit 2, before anything is timed
    assert main(["bench", "mixers", "--quick", "linear:nope=1"]) == 2
    cap = capsys.readouterr()
    assert "nope" in cap.err and "bench mixers:" not in cap.out
    for argv in (["bench", "mixers", "--quick", "nosuch"], ["bench", "mixers", "--quick", "gdn:beta"],
                 ["bench", "throughput", "--quick", "gdn"]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.strip()
    assert not list(tmp_path.glob("*.tmp*"))


def test_models_listing_builds_every_mechanism(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ["lla", "parallax", "softmax", "mesa", "gdn", "mamba", "gla", "hyena", "linear"]:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert "error" not in line and line.split()[1].isdigit()


def test_recording_host_syncs_collects_torch_sync_warnings_only(monkeypatch):
    """The recorder behind check-mixer's host-syncs check and the trainer's GPU test: it switches
    CUDA's sync debugging on for the block and keeps torch's sync warnings (and only those). Torch's
    switch is stubbed here (no GPU); the real one runs in tests/gpu."""
    import warnings

    import torch

    from mixzoo.check import host_syncs, recording_host_syncs
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    with recording_host_syncs() as where:
        assert modes == ["warn"]
        warnings.warn("Synchronization debug mode is a prototype feature", stacklevel=1)  # torch's one-time notice
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        assert where == []                                                    # filled when the block ends
    assert modes == ["warn", "default"]
    assert len(where) == 1 and "test_check_mixer.py" in where[0] and "synchronizing" in where[0]
    assert host_syncs(lambda: None) == []
    with pytest.raises(ValueError):                      # the mode is restored on errors too
        with recording_host_syncs():
            raise ValueError
    assert modes[-1] == "default"


def test_bench_mixers_table_shows_graphed_times_and_capture_failures():
    from mixzoo.bench.mixers import format_table, progress_line
    base = dict(backend="b", params=1, warmup_s=0.1, peak_mem_bytes=2**20)
    rows = [dict(mechanism="softmax", ms=2.0, graphed_ms=0.5, **base),
            dict(mechanism="gdn", ms=6.0, graphed_ms=1.5, **base),
            dict(mechanism="lla", ms=3.0, graphed_error="RuntimeError: host sync", **base)]
    lines = format_table(rows).splitlines()
    assert "graphed ms" in lines[0]
    assert lines[2].split()[-2:] == ["1.50", "3.00"] and lines[2].split()[4] == "3.00"
    assert "capture failed: RuntimeError: host sync" in lines[3]
    assert "graphed 1.50 ms" in progress_line(rows[1])
    assert "graphed" not in format_table([dict(mechanism="gdn", ms=6.0, **base)])
