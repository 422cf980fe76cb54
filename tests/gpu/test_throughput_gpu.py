"""Step modes on a GPU give plain training's numbers: ``graphed`` (the step as one CUDA graph)
against the eager Lightning run, and ``stacked`` / ``stacked+graphed`` (4 runs as one batched model)
against 4 separate eager runs, over 20 steps at MAD's baseline shape (mad-recall, the mad recipe:
width 128 in 16 heads, batch 128), for softmax and every mechanism whose stacked step runs as such
(Mamba-1's selective scan falls back to one model at a time, a fallback the trainer names).

bf16 autocast: the graphed step runs the same kernels as the eager one (AdamW capturable rather
than not), the stacked one batched GEMMs and kernels over K x B sequences, so the numbers agree up
to bf16 rounding in a different order, which 20 steps of training amplify: the tolerance on the
training loss at each validation (steps 5, 10, 15, 20) is 2e-2 relative. Each test also checks
that the mode asked for is the mode that ran (no silent fallback), and prints the largest relative
difference it saw (run with -s). Set MIXZOO_GPU_OUT=file.jsonl to append them there too.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STEPS, EVERY, RTOL = 20, 5, 2e-2


def _setup():
    from mixzoo.models import RECIPES, ModelConfig
    from mixzoo.tasks.mad import MADRecall
    from mixzoo.train import TrainConfig
    task = MADRecall()
    data = {"train": task.generate("train", 1024, 0, "cuda"), "val": task.generate("val", 128, 0, "cuda"),
            "test": task.generate("test", 128, 0, "cuda")}
    cfg = dict(steps=STEPS, batch_size=128, eval_every=EVERY, eval_batch_size=128, lr=3e-3)
    return task, ModelConfig(**RECIPES["mad"]), data, cfg, TrainConfig


def _rel(a: list[dict], b: list[dict], until: int = STEPS) -> float:
    assert [h["step"] for h in a] == [h["step"] for h in b] == list(range(EVERY, until + 1, EVERY))
    return max(abs(x["train_loss"] - y["train_loss"]) / abs(x["train_loss"]) for x, y in zip(a, b))


def _record(name: str, rel: float) -> None:
    print(f"\n{name}: largest relative difference of the training loss {rel:.2e}")
    if os.environ.get("MIXZOO_GPU_OUT"):
        with open(os.environ["MIXZOO_GPU_OUT"], "a") as f:
            f.write(json.dumps({"test": name, "max_rel_train_loss": rel}) + "\n")


MIXERS = ["softmax", "gdn", "parallax", "mesa", "gla", "mamba", "hyena", "lla"]


# optimizer=muon: the graphed step runs GraphMuon (tensor learning rates), the eager one torch.optim.Muon
@pytest.mark.parametrize("mixer,optimizer", [(m, "adamw") for m in MIXERS] + [("softmax", "muon"), ("parallax", "muon")])
def test_graphed_matches_eager(mixer, optimizer, monkeypatch):
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")        # the eager run on the graphed run's kernels
    from mixzoo.train import train
    task, mcfg, data, cfg, TrainConfig = _setup()
    cfg = {**cfg, "optimizer": optimizer}
    eager = train(task, mixer, {}, mcfg, TrainConfig(**cfg), seed=0, device="cuda", data=data)
    graphed = train(task, mixer, {}, mcfg, TrainConfig(step_mode="graphed", **cfg), seed=0, device="cuda", data=data)
    assert graphed.step_mode == "graphed", graphed.step_mode_reason
    assert graphed.state == eager.state == "COMPLETE" and graphed.backend == eager.backend
    rel = _rel(eager.history, graphed.history)
    _record(f"graphed-vs-eager[{mixer}{'' if optimizer == 'adamw' else ', ' + optimizer}]", rel)
    assert rel < RTOL


@pytest.mark.parametrize("mode", ["stacked", "stacked+graphed"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_stacked_matches_separate_runs(mixer, mode, monkeypatch):
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")        # the separate runs on the stacked run's kernels
    from mixzoo.train import train
    from mixzoo.train.stacked import train_stacked
    task, mcfg, data, cfg, TrainConfig = _setup()
    # learning rates where 20 steps train smoothly: at 3e-3 and 5e-3 Hyena's loss spikes for a step or two
    # (to 2.4-3.1 from 2.1) in separate runs as well as stacked ones, at steps that move with the kernels
    # chosen (MIXZOO_CONV / SWIGLU / RMSNORM=torch), so there a difference measures that, not the stacking
    cfgs = [TrainConfig(**{**cfg, "lr": lr}, step_mode=mode) for lr in (5e-4, 1e-3, 1.5e-3, 2e-3)]
    seeds = [0, 1, 2, 3]
    stacked = train_stacked(task, mixer, {}, mcfg, cfgs, seeds, device="cuda", data=data)
    assert [r.step_mode for r in stacked] == [mode] * 4, stacked[0].step_mode_reason
    rel = 0.0
    for c, s, r in zip(cfgs, seeds, stacked):
        alone = train(task, mixer, {}, mcfg, TrainConfig(**{**cfg, "lr": c.lr}), seed=s, device="cuda", data=data)
        assert r.state == alone.state == "COMPLETE" and r.backend == alone.backend
        rel = max(rel, _rel(alone.history, r.history))
    _record(f"{mode}-K4-vs-separate[{mixer}]", rel)
    assert rel < RTOL


@pytest.mark.parametrize("mixer", ["softmax", "gdn"])
def test_stacked_graphed_compaction_matches_separate_runs(mixer, monkeypatch):
    """stacked+graphed K=4 where runs stop (their on_eval raises, as a prune does): run 1 at step 5, run 3
    at step 10; each time the stack is rebuilt without them (a new capture of 3, then of 2 models, said in
    the log). Every run against its separate eager run, stopped at the same validation."""
    import lightning.pytorch as pl
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")        # the separate runs on the stacked run's kernels
    monkeypatch.setenv("MIXZOO_STACK_COMPACT", "1")
    from mixzoo.train import stacked, train
    monkeypatch.setattr(stacked, "REBUILD_STEPS", {False: 0, True: 0})     # a rebuild at every stop, even in 20 steps
    task, mcfg, data, cfg, TrainConfig = _setup()
    cfgs = [TrainConfig(**{**cfg, "lr": lr}, step_mode="stacked+graphed") for lr in (5e-4, 1e-3, 1.5e-3, 2e-3)]
    seeds, stops = [0, 1, 2, 3], [None, 5, None, 10]

    class Pruned(Exception):
        pass

    def prune_at(at):
        def hook(step, val):
            if step >= at:
                raise Pruned(step)
        return hook

    class StopAt(pl.Callback):              # the separate run's stop: after its validation of that step
        def __init__(self, at):
            self.at = at

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step >= self.at:
                trainer.should_stop = True
    logs = []
    res = stacked.train_stacked(task, mixer, {}, mcfg, cfgs, seeds, device="cuda", data=data, log=logs.append,
                                on_eval=[None if s is None else prune_at(s) for s in stops])
    assert [m for m in logs if "compacted" in m] == ["stacked: compacted 4 -> 3 at step 5",
                                                     "stacked: compacted 3 -> 2 at step 10"], logs
    assert [r.step_mode for r in res] == ["stacked+graphed"] * 4, res[0].step_mode_reason
    rel = 0.0
    for c, s, stop, r in zip(cfgs, seeds, stops, res):
        alone = train(task, mixer, {}, mcfg, TrainConfig(**{**cfg, "lr": c.lr}), seed=s, device="cuda", data=data,
                      callbacks=[] if stop is None else [StopAt(stop)])
        assert r.state == alone.state == "COMPLETE" and r.backend == alone.backend
        assert r.steps == alone.steps == (stop or STEPS) and isinstance(r.hook_error, Pruned) == (stop is not None)
        rel = max(rel, _rel(alone.history, r.history, stop or STEPS))
    _record(f"stacked+graphed-K4-compacted-vs-separate[{mixer}]", rel)
    assert rel < RTOL


@pytest.mark.parametrize("mode", ["stacked", "stacked+graphed"])
def test_mamba_ssd_in_calls_of_one_model_matches_separate_runs(mode, monkeypatch):
    """mamba-ssm's SSD under stacking in one call per model (its split by torch's cumsum row limit, here made so
    small that one model fills a call, as at length 1024 with the mad recipe): the stacked test above for Mamba-2."""
    from mixzoo.models.mamba import ssd_op
    from mixzoo.train import vmapfold
    if ssd_op() is None:
        pytest.skip("mamba-ssm is not installed here")
    monkeypatch.setattr(vmapfold, "SCAN_LOG_THREADS", -3)      # 2^(-3 + 6) = 8 rows a call: one model
    test_stacked_matches_separate_runs("mamba", mode, monkeypatch)


@pytest.mark.parametrize("mode", ["stacked", "stacked+graphed"])
def test_mesa_heads_fold_matches_separate_runs(mode, monkeypatch):
    """MIXZOO_MESA_FOLD=whole (fla's chunk_mesa_net once for the K models, their heads side by side, where the default
    calls it once a model): the stacked test above for MesaNet."""
    monkeypatch.setenv("MIXZOO_MESA_FOLD", "whole")
    test_stacked_matches_separate_runs("mesa", mode, monkeypatch)


@pytest.mark.parametrize("mode", ["stacked", "stacked+graphed"])
def test_mesa_in_kernel_l2norm_stacked_matches_separate_runs(mode, monkeypatch):
    """MIXZOO_MESA_L2NORM=fla (q, k normalized inside fla's call): stacked runs against separate ones, and
    the first separate run against the same run with F.normalize (the switch off)."""
    monkeypatch.setenv("MIXZOO_EAGER_KERNELS", "1")
    from mixzoo.train import train
    from mixzoo.train.stacked import train_stacked
    task, mcfg, data, cfg, TrainConfig = _setup()
    monkeypatch.setenv("MIXZOO_MESA_L2NORM", "torch")
    before = train(task, "mesa", {}, mcfg, TrainConfig(**{**cfg, "lr": 5e-4}), seed=0, device="cuda", data=data)
    monkeypatch.setenv("MIXZOO_MESA_L2NORM", "fla")
    cfgs = [TrainConfig(**{**cfg, "lr": lr}, step_mode=mode) for lr in (5e-4, 1e-3)]
    stacked = train_stacked(task, "mesa", {}, mcfg, cfgs, [0, 1], device="cuda", data=data)
    rel = 0.0
    for c, s, r in zip(cfgs, [0, 1], stacked):
        alone = train(task, "mesa", {}, mcfg, TrainConfig(**{**cfg, "lr": c.lr}), seed=s, device="cuda", data=data)
        assert r.state == alone.state == "COMPLETE" and r.backend == alone.backend
        assert r.backend.startswith("fla-chunk+fla-l2norm")
        rel = max(rel, _rel(alone.history, r.history))
        if s == 0:
            switch = _rel(before.history, alone.history)
    _record(f"{mode}-K2-vs-separate[mesa, fla l2norm]", rel)
    _record("mesa fla l2norm vs F.normalize", switch)
    assert rel < RTOL and switch < RTOL


def test_failed_capture_leaves_the_device_usable():
    """A capture invalidated by a host sync raises, and afterwards random ops and captures work."""
    from mixzoo.train.graphed import capture
    dev = torch.device("cuda")
    x = torch.ones(4, device=dev)
    cur = torch.cuda.current_stream(dev)
    with pytest.raises(RuntimeError):      # torch's AcceleratorError is a RuntimeError
        capture(lambda: float(x.sum().item()), dev)
    assert torch.cuda.current_stream(dev) == cur
    torch.randn(8, device=dev)                    # raised "Offset increment outside graph capture" before
    y = torch.zeros(4, device=dev)
    g = capture(lambda: y.add_(torch.rand(4, device=dev)), dev)
    g.replay()
    torch.cuda.synchronize()
    assert bool(((y > 0) & (y < 1)).all())


@pytest.mark.parametrize("mixer", ["softmax", "parallax"])
def test_stacked_graphed_muon_matches_separate_runs(mixer):
    """optimizer=muon, stacked+graphed K=4 (StackedMuon) against 4 separate eager runs (torch.optim.Muon)."""
    from mixzoo.train import train
    from mixzoo.train.stacked import train_stacked
    task, mcfg, data, cfg, TrainConfig = _setup()
    cfgs = [TrainConfig(**{**cfg, "lr": lr, "optimizer": "muon"}, step_mode="stacked+graphed")
            for lr in (1e-3, 2e-3, 3e-3, 5e-3)]
    stacked = train_stacked(task, mixer, {}, mcfg, cfgs, [0, 1, 2, 3], device="cuda", data=data)
    assert [r.step_mode for r in stacked] == ["stacked+graphed"] * 4, stacked[0].step_mode_reason
    rel = 0.0
    for s, (c, r) in enumerate(zip(cfgs, stacked)):
        alone = train(task, mixer, {}, mcfg, TrainConfig(**{**cfg, "lr": c.lr, "optimizer": "muon"}), seed=s,
                      device="cuda", data=data)
        assert r.state == alone.state == "COMPLETE"
        rel = max(rel, _rel(alone.history, r.history))
    _record(f"stacked+graphed-muon-K4-vs-separate[{mixer}]", rel)
    assert rel < RTOL


FRESH_STACKED = r"""
import json, sys
sys.path.insert(0, {root!r})
from mixzoo.models import RECIPES, ModelConfig
from mixzoo.tasks.mad import MADRecall
from mixzoo.train import TrainConfig
from mixzoo.train.stacked import train_stacked
task = MADRecall()
data = {{s: task.generate(s, 256, 0, "cuda") for s in ("train", "val", "test")}}
cfg = TrainConfig(steps=10, batch_size=64, eval_every=5, eval_batch_size=64, step_mode="stacked+graphed")
rs = train_stacked(task, {mixer!r}, {{}}, ModelConfig(**RECIPES["mad"]), [cfg] * 2, [0, 1], device="cuda", data=data)
print("RESULT", json.dumps([r.backend for r in rs] + [rs[0].step_mode]))
"""


@pytest.mark.parametrize("mixer", ["gdn", "lla", "softmax"])
def test_a_fresh_stacked_process_takes_the_fast_paths(mixer):
    """A sweep's worker starts with a stacked step: its first forward runs under vmap. gdn must still take
    mixzoo's recurrent scan there (its self-check runs under vmap; the dqkwg step's once answered False under
    vmap for the whole process), LLA its Triton kernel with the explicit solve of heads of 8, folded (it once fell back to
    eager), and softmax mixzoo's attention kernels for heads of 8 (their self-check also runs under vmap)."""
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[2])
    p = subprocess.run([sys.executable, "-c", FRESH_STACKED.format(root=root, mixer=mixer)], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    want = {"gdn": "triton-rec", "lla": "triton-direct", "softmax": "triton-attn"}[mixer]
    assert r == [want, want, "stacked+graphed"], r


def _norm_kernels(fold: str, monkeypatch) -> tuple[list[str], float, torch.Tensor, torch.Tensor]:
    """Kernels (names), device time (ms) and the output and input gradient of 4 stacked RMSNorms on
    (128, 128, 128) activations, forward and backward under vmap, with the fold on ("1") or off."""
    from torch.func import functional_call, stack_module_state, vmap
    from torch.profiler import ProfilerActivity, profile

    from mixzoo.models.common import RMSNorm
    from mixzoo.train.vmapfold import folding
    monkeypatch.setenv("MIXZOO_FOLD_RMS_NORM", fold)
    monkeypatch.setenv("MIXZOO_RMSNORM", "torch")          # F.rms_norm itself, not mixzoo's norm kernel
    torch.manual_seed(0)
    ms = [RMSNorm(128).cuda() for _ in range(4)]
    for m in ms:
        torch.nn.init.normal_(m.weight, 1.0, 0.1)
    params, bufs = stack_module_state(ms)
    x = torch.randn(4, 128, 128, 128, device="cuda", requires_grad=True)

    def step():
        with folding():
            y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
        (gx,) = torch.autograd.grad(y.square().sum(), (x,))
        return y, gx
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        y, gx = step()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e.name for e in ev], sum(e.device_time for e in ev) / 1e3, y.detach(), gx


def test_stacked_rms_norm_runs_the_fused_kernel(monkeypatch):
    """vmap decomposes F.rms_norm into elementwise operators; under ``folding()`` a stacked step
    runs CUDA's fused norm kernels, forward and backward, with the numbers of the decomposition.
    Prints both kernel counts and device times (the fold's saving at this size)."""
    names, ms_on, y_on, g_on = _norm_kernels("1", monkeypatch)
    names_off, ms_off, y_off, g_off = _norm_kernels("0", monkeypatch)
    fused = [n for n in names if "norm" in n.lower()]
    print(f"\nrms_norm, 4 models of (128, 128, 128): folded {len(names)} kernels {ms_on:.3f} ms "
          f"({len(fused)} norm kernels); functorch's decomposition {len(names_off)} kernels {ms_off:.3f} ms")
    assert fused, names
    assert len(names) < len(names_off)
    torch.testing.assert_close(y_on, y_off, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_on, g_off, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mixer", MIXERS)
def test_vmapped_validation_gives_each_model_s_metrics(mixer):
    """MIXZOO_STACKED_EVAL=vmapped's evaluate_stack on the GPU (bf16 autocast, the mechanisms' kernels under vmap
    with no gradient): 4 models of different seeds, each row's validation loss and accuracy as ``loop.evaluate``
    of that model alone, up to bf16 rounding in another order (loss within 1e-2 relative, accuracy within 0.01)."""
    from mixzoo.models import build_model
    from mixzoo.train.loop import evaluate
    from mixzoo.train.stacked import StackedModel, evaluate_stack
    from mixzoo.train.steploop import precision_of
    from mixzoo.train.vmapfold import folding
    task, mcfg, data, cfg, TrainConfig = _setup()
    precision = precision_of(TrainConfig(**cfg), torch.device("cuda"))
    models = []
    for s in range(4):
        torch.manual_seed(s)
        models.append(build_model(task.backbone, mixer, {}, mcfg, vocab=task.vocab_size).cuda())
    val = task.generate("val", 512, 0, "cuda")
    alone = [evaluate(m, task, val, 256, precision) for m in models]
    with folding():
        got = evaluate_stack(StackedModel(models), task, [val] * 4, 256, precision)
    rel = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(alone, got))
    acc = max(abs(a["accuracy"] - b["accuracy"]) for a, b in zip(alone, got))
    _record(f"vmapped-validation[{mixer}]", rel)
    assert rel < 1e-2 and acc <= 0.01, (alone, got)
