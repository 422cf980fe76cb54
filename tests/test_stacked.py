"""Stacked training (mixzoo.train.stacked): K runs as one batched model give each run's numbers.

Tolerances (float32, CPU): losses (train and validation) within 1e-5 relative; final weights within
2e-4 of each tensor's norm and, elementwise, within 1e-2 x the run's learning rate. Adam's step is
lr x m/sqrt(v), about lr whatever the gradient's size, so where a gradient is rounding noise (an
embedding row barely used) a reordered sum moves that weight by a fraction of lr: the elementwise
bound is stated in units of lr. Observed: losses <= 7e-7, norms <= 3.4e-5 (gdn), elements <= 8.4e-4 lr;
hyena's losses ~6e-5 (its long convolutions, LOSS_RTOL below).
"""
from __future__ import annotations

import math

import pytest
import torch

from mixzoo.errors import UsageError
from mixzoo.models import ModelConfig
from mixzoo.tasks.mqar import MQAR
from mixzoo.train import TrainConfig, train
from mixzoo.train.stacked import StackedAdamW, StackedModel, StackedMuon, clip_per_model_, train_stacked

TASK = MQAR(V=32, L=16, kv=2)
MCFG = ModelConfig(d_model=16, num_heads=2)
BASE = dict(steps=8, batch_size=4, eval_every=4, n_train=32, n_val=8, n_test=8, eval_batch_size=8)
HP = ((3e-3, 0.1), (1e-2, 0.0), (5e-3, 0.1))      # (lr, weight_decay) of each run
SEEDS = (0, 1, 0)                                 # seed 0 twice: same data and init, other lr


pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py


def _grab():
    import lightning.pytorch as pl

    class Grab(pl.Callback):
        def on_train_end(self, trainer, module):
            self.sd = {k: v.detach().clone() for k, v in module.model.state_dict().items()}
    return Grab()


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


# hyena's long convolutions of K x B sequences (Toeplitz products at these lengths, FFTs past 128) are
# not those of B: they sum in another order and round differently (~1e-7), which
# 8 Adam steps at these learning rates amplify to ~1e-4 in the loss
LOSS_RTOL = {"hyena": 3e-4}


# mamba with chunks of 4: Mamba-2's shared-B/C chunk form with several chunks (its folded state products)
@pytest.mark.parametrize("mixer,knobs", [(m, {}) for m in ("softmax", "gdn", "parallax", "mesa", "gla", "mamba", "hyena")]
                         + [("mamba", {"chunk_size": 4})])
def test_stacked_runs_match_separate_runs(mixer, knobs):
    rel = LOSS_RTOL.get(mixer, 1e-5)
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, **BASE) for lr, wd in HP]
    solo = []
    for c, s in zip(cfgs, SEEDS):
        g = _grab()
        solo.append((train(TASK, mixer, knobs, MCFG, c, seed=s, device="cpu", callbacks=[g]), g.sd))
    stacked = train_stacked(TASK, mixer, knobs, MCFG, cfgs, SEEDS, device="cpu", keep_weights=True)
    assert [r.step_mode for r in stacked] == ["stacked"] * 3
    for (r, sd), q, (lr, _) in zip(solo, stacked, HP):
        assert q.state == r.state == "COMPLETE" and q.steps == r.steps == BASE["steps"]
        assert q.backend == r.backend and q.params == r.params and q.best_step == r.best_step
        assert [h["step"] for h in q.history] == [h["step"] for h in r.history] == [4, 8]
        for a, b in zip(r.history, q.history):
            assert _close(a["train_loss"], b["train_loss"], rel) and _close(a["loss"], b["loss"], rel), (a, b)
        for name in ("loss", "accuracy"):
            assert _close(r.val[name], q.val[name], rel) and _close(r.test[name], q.test[name], rel)
        assert sd.keys() == q.final_state_dict.keys()
        for k, p in sd.items():
            d = p - q.final_state_dict[k]
            assert float(d.norm()) <= 2e-4 * float(p.norm()) + 1e-12, k
            assert float(d.abs().max()) <= 1e-2 * lr, k


def test_stacked_adamw_and_clipping_are_torch_s_per_model():
    """Per model k: clip_grad_norm_ then torch.optim.AdamW (betas 0.9, 0.98; decay on matrices only)
    under the trainer's schedule, against the flat stacked versions, over 6 steps."""
    from mixzoo.train.optim import build_optimizer, lr_lambda
    torch.manual_seed(0)
    K, cfgs = 3, [TrainConfig(steps=6, lr=lr, weight_decay=wd, warmup_frac=0.3) for lr, wd in HP]
    models = [torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3)) for _ in range(K)]
    refs = [torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3)) for _ in range(K)]
    for m, r in zip(models, refs):
        r.load_state_dict(m.state_dict())
    sm, opts = StackedModel(models), [build_optimizer(r, c, fused=False) for r, c in zip(refs, cfgs)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda(c)) for o, c in zip(opts, cfgs)]
    sopt = StackedAdamW(sm, cfgs)
    idx = torch.zeros(1, dtype=torch.long)
    for _ in range(6):
        grads = [{n: torch.randn_like(p) * 3 for n, p in r.named_parameters()} for r in refs]
        for r, gr, o, s in zip(refs, grads, opts, scheds):
            for n, p in r.named_parameters():
                p.grad = gr[n].clone()
            torch.nn.utils.clip_grad_norm_(r.parameters(), 1.0, foreach=True)
            o.step()
            s.step()
        for n, p in zip(sm.names, sm.leaves):
            p.grad = torch.stack([gr[n] for gr in grads])
        g = sm.flat_grad()
        clip_per_model_(g, 1.0)
        sopt.step(g, idx)
        idx += 1
    for k, r in enumerate(refs):
        for n, p in r.named_parameters():
            torch.testing.assert_close(sm.params[n][k], p.detach(), rtol=1e-6, atol=1e-7)


class _Tiny(torch.nn.Module):
    """An embedding and a head (AdamW's under Muon), a hidden matrix (Muon's), a norm and biases."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.hidden = torch.nn.Linear(6, 9)
        self.norm = torch.nn.LayerNorm(9)
        self.head = torch.nn.Linear(9, 4)


def test_stacked_muon_is_torch_s_per_model():
    """Per model k: torch.optim.Muon on the hidden matrix and torch.optim.AdamW on the rest
    (``build_optimizer`` with optimizer="muon"), under the schedule and per-model lr / muon_lr /
    weight decay, against StackedMuon on the flat weights, over 6 steps."""
    from mixzoo.train.optim import build_optimizer, lr_lambda, split_params
    torch.manual_seed(0)
    K = 3
    cfgs = [TrainConfig(steps=6, lr=lr, weight_decay=wd, warmup_frac=0.3, optimizer="muon",
                        muon_lr=None if k else 2e-2) for k, (lr, wd) in enumerate(HP)]
    models, refs = [_Tiny() for _ in range(K)], [_Tiny() for _ in range(K)]
    for m, r in zip(models, refs):
        r.load_state_dict(m.state_dict())
    first = [n for n, _ in split_params(models[0])[0]]
    assert first == ["hidden.weight"]
    sm = StackedModel(models, first=first)
    assert sm.names[0] == "hidden.weight" and sm.n_first == 54 and sm.first_views == [("hidden.weight", 0, (9, 6))]
    opts = [build_optimizer(r, c, fused=False) for r, c in zip(refs, cfgs)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lr_lambda(c)) for o, c in zip(opts, cfgs)]
    sopt = StackedMuon(sm, cfgs)
    idx = torch.zeros(1, dtype=torch.long)
    for _ in range(6):
        grads = [{n: torch.randn_like(p) for n, p in r.named_parameters()} for r in refs]
        for r, gr, o, s in zip(refs, grads, opts, scheds):
            for n, p in r.named_parameters():
                p.grad = gr[n].clone()
            o.step()
            s.step()
        for n, p in zip(sm.names, sm.leaves):
            p.grad = torch.stack([gr[n] for gr in grads])
        sopt.step(sm.flat_grad(), idx)
        idx += 1
    for k, r in enumerate(refs):
        for n, p in r.named_parameters():
            torch.testing.assert_close(sm.params[n][k], p.detach(), rtol=1e-6, atol=1e-7, msg=f"{k} {n}")


@pytest.mark.parametrize("mixer", ["softmax", "parallax"])
def test_stacked_muon_runs_match_separate_runs(mixer):
    """optimizer=muon: K runs stacked against each trained alone (Lightning, torch.optim.Muon)."""
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, optimizer="muon", **BASE) for lr, wd in HP]
    solo = [train(TASK, mixer, {}, MCFG, c, seed=s, device="cpu") for c, s in zip(cfgs, SEEDS)]
    stacked = train_stacked(TASK, mixer, {}, MCFG, cfgs, SEEDS, device="cpu")
    assert [r.step_mode for r in stacked] == ["stacked"] * 3, stacked[0].step_mode_reason
    for r, q in zip(solo, stacked):
        assert q.state == r.state == "COMPLETE" and q.best_step == r.best_step
        for a, b in zip(r.history, q.history):
            assert _close(a["train_loss"], b["train_loss"], 1e-4) and _close(a["loss"], b["loss"], 1e-4), (a, b)
        assert _close(r.test["loss"], q.test["loss"], 1e-4)


def test_one_run_stopping_leaves_the_others_alone():
    """Run 1's on_eval raises at its first validation: it stops there (frozen, the error kept for the
    caller) while runs 0 and 2 train on, with their own numbers."""
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, **BASE) for lr, wd in HP]

    class Pruned(Exception):
        pass

    def prune(step, val):
        raise Pruned(step)
    res = train_stacked(TASK, "softmax", {}, MCFG, cfgs, SEEDS, device="cpu", on_eval=[None, prune, None])
    assert isinstance(res[1].hook_error, Pruned) and res[1].steps == 4 and len(res[1].history) == 1
    assert res[0].hook_error is None and res[0].steps == 8
    alone = train(TASK, "softmax", {}, MCFG, cfgs[2], seed=SEEDS[2], device="cpu")
    assert all(_close(a["train_loss"], b["train_loss"]) for a, b in zip(alone.history, res[2].history))
    assert _close(alone.test["loss"], res[2].test["loss"])


@pytest.mark.parametrize("mixer", ["softmax", "gdn", "parallax", "mesa", "gla", "mamba", "hyena", "lla"])
def test_a_stack_validated_in_one_vmapped_forward_gives_each_model_s_metrics(mixer):
    """evaluate_stack: each row's metrics are loop.evaluate's of that model alone on its own split (rows 0 and 2
    share one split object, row 1 has another), also when the output budget cuts the batches short."""
    from mixzoo.models import build_model
    from mixzoo.train.loop import evaluate
    from mixzoo.train.stacked import evaluate_stack
    models = []
    for s in SEEDS:
        torch.manual_seed(s)
        models.append(build_model(TASK.backbone, mixer, {}, MCFG, vocab=TASK.vocab_size))
    sm = StackedModel(models)
    split = {s: TASK.generate("val", 12, s) for s in set(SEEDS)}
    datas = [split[s] for s in SEEDS]
    alone = [evaluate(m, TASK, d, 8, "32") for m, d in zip(models, datas)]
    assert alone[0] != alone[1]
    for budget in (2 ** 28, 3 * 16 * 32 * 5):            # batches of 8, then of 5 sequences a model
        got = evaluate_stack(sm, TASK, datas, 8, "32", max_elements=budget)
        for a, b in zip(alone, got):
            assert a.keys() == b.keys()
            for name in a:
                assert _close(a[name], b[name], LOSS_RTOL.get(mixer, 1e-5)), (mixer, budget, name, a, b)
    assert sm.template.training                           # put back as it was


def test_a_stacked_run_validating_vmapped_gives_each_run_s_numbers(monkeypatch):
    """MIXZOO_STACKED_EVAL=vmapped: the same histories, best steps and scores as the default's validations one model
    at a time; if the vmapped validation fails, the run logs it and validates one model at a time from there."""
    import mixzoo.train.stacked as stacked
    from mixzoo import kernels
    monkeypatch.setenv("MIXZOO_STACKED_EVAL", "stacked")
    assert kernels.switch_error() == "MIXZOO_STACKED_EVAL='stacked'; allowed: models, vmapped (or unset)"
    monkeypatch.delenv("MIXZOO_STACKED_EVAL")
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, **BASE) for lr, wd in HP]
    calls = []
    real = stacked.evaluate_stack

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(stacked, "evaluate_stack", counted)
    plain = train_stacked(TASK, "gdn", {}, MCFG, cfgs, SEEDS, device="cpu")
    assert calls == []                                    # not by default
    monkeypatch.setenv("MIXZOO_STACKED_EVAL", "vmapped")
    vm = train_stacked(TASK, "gdn", {}, MCFG, cfgs, SEEDS, device="cpu")
    assert len(calls) == 2                                # one a validation, for the three runs
    for a, b in zip(plain, vm):
        assert a.best_step == b.best_step and len(a.history) == len(b.history) == 2
        for x, y in zip(a.history, b.history):
            assert x["step"] == y["step"] and _close(x["loss"], y["loss"]) and x["accuracy"] == y["accuracy"]
        assert _close(a.test["loss"], b.test["loss"])

    def broken(*a, **kw):
        raise RuntimeError("no batching rule")
    monkeypatch.setattr(stacked, "evaluate_stack", broken)
    lines = []
    fell = train_stacked(TASK, "gdn", {}, MCFG, cfgs, SEEDS, device="cpu", log=lines.append)
    assert [r.state for r in fell] == ["COMPLETE"] * 3
    assert any("validating the models one at a time from step 4: RuntimeError: no batching rule" in x for x in lines)
    for a, b in zip(plain, fell):
        assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    with pytest.warns(UserWarning, match="validating the models one at a time from step 4"):   # no log: a warning
        train_stacked(TASK, "gdn", {}, MCFG, cfgs, SEEDS, device="cpu")


class _Pruned(Exception):
    pass


def _stop_at(step: int):
    """A stacked run's on_eval that stops it (as an Optuna prune does) at its validation of ``step``."""
    def hook(s, val):
        if s >= step:
            raise _Pruned(s)
    return hook


def _stop_after(step: int):
    """The same stop for a separate run (loop.train raises what on_eval raises): a Lightning callback
    that ends training after the validation of ``step``, as early stop does."""
    import lightning.pytorch as pl

    class Stop(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step >= step:
                trainer.should_stop = True      # read after mixzoo's Evaluator has validated this step
    return Stop()


def _same_run(a, b, rel: float, lr: float | None) -> None:
    """Two RunResults of one run: steps, validations, losses within ``rel``, final weights (with ``lr``)
    within the module docstring's tolerance."""
    assert a.state == b.state == "COMPLETE" and a.steps == b.steps and a.best_step == b.best_step
    assert [h["step"] for h in a.history] == [h["step"] for h in b.history]
    for x, y in zip(a.history, b.history):
        assert _close(x["train_loss"], y["train_loss"], rel) and _close(x["loss"], y["loss"], rel), (x, y)
    for name in ("loss", "accuracy"):
        assert _close(a.val[name], b.val[name], rel) and _close(a.test[name], b.test[name], rel)
    if lr is not None:
        sa, sb = a.final_state_dict, b.final_state_dict
        assert sa.keys() == sb.keys()
        for k, p in sa.items():
            d = p - sb[k]
            assert float(d.norm()) <= 2e-4 * float(p.norm()) + 1e-12, k
            assert float(d.abs().max()) <= 1e-2 * lr, k


# 4 runs, 3 validations: runs 1 and 3 (seed 1) stop at step 4, run 0 at step 8, run 2 trains to the end
# (alone: a stack of one, with seed 1's training set dropped at the first compaction)
COMPACT = {**BASE, "steps": 12, "n_train": 48}
HP4, SEEDS4, STOPS4 = HP + ((2e-3, 0.05),), (0, 1, 0, 1), (8, 4, None, 4)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_stopped_runs_are_compacted_out_of_the_stack(optimizer, monkeypatch):
    """Runs that stop leave the stack at that validation (``MIXZOO_STACK_COMPACT``, on by default):
    the later steps run the survivors only (K 4 -> 2 -> 1, said in the log), and every run's result
    is the one it gets with the stopped runs frozen in the stack (``MIXZOO_STACK_COMPACT=0``, exactly
    for the runs stopped before any compaction) and trained alone (``loop.train``, stopped at the
    same validation)."""
    from mixzoo.train import stacked
    monkeypatch.setattr(stacked, "REBUILD_STEPS", {False: 0, True: 0})       # compact at every stop
    ks, logs = [], []
    step = stacked.Stack.step

    def spy(self):
        ks.append(self.sm.K)
        step(self)
    monkeypatch.setattr(stacked.Stack, "step", spy)
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, optimizer=optimizer, **COMPACT) for lr, wd in HP4]

    def stacked_run(switch: str):
        monkeypatch.setenv("MIXZOO_STACK_COMPACT", switch)
        ks.clear()
        logs.clear()
        res = train_stacked(TASK, "softmax", {}, MCFG, cfgs, SEEDS4, device="cpu", log=logs.append,
                            keep_weights=True, on_eval=[None if s is None else _stop_at(s) for s in STOPS4])
        return res, list(ks), [m for m in logs if "compacted" in m]
    compacted, k_on, said = stacked_run("1")
    assert k_on == [4] * 4 + [2] * 4 + [1] * 4
    assert said == ["stacked: compacted 4 -> 2 at step 4", "stacked: compacted 2 -> 1 at step 8"]
    frozen, k_off, said_off = stacked_run("0")
    assert k_off == [4] * 12 and said_off == []
    rel = 1e-5 if optimizer == "adamw" else 1e-4          # as the stacked-vs-separate tests above
    for q, f, stop, (lr, _) in zip(compacted, frozen, STOPS4, HP4):
        assert q.step_mode == f.step_mode == "stacked"
        assert q.steps == (stop or COMPACT["steps"]) and len(q.history) == q.steps // COMPACT["eval_every"]
        assert (q.hook_error is None) == (f.hook_error is None) == (stop is None)
        _same_run(q, f, 1e-5, lr)
        if stop == 4:                   # stopped before any compaction: the same computation throughout
            assert [{k: v for k, v in h.items() if k not in ("steps_per_s", "train_time_s")} for h in q.history] \
                == [{k: v for k, v in h.items() if k not in ("steps_per_s", "train_time_s")} for h in f.history]
            assert q.test == f.test and q.val == f.val
            assert all(torch.equal(v, f.final_state_dict[k]) for k, v in q.final_state_dict.items())
    for c, s, stop, q, (lr, _) in zip(cfgs, SEEDS4, STOPS4, compacted, HP4):
        g = _grab()
        alone = train(TASK, "softmax", {}, MCFG, c, seed=s, device="cpu",
                      callbacks=[g] if stop is None else [_stop_after(stop), g])
        alone.final_state_dict = g.sd
        _same_run(alone, q, rel, lr if optimizer == "adamw" else None)     # Muon: the losses, as above


def test_when_a_stack_is_compacted():
    """A rebuild when the steps it saves (the stopped share of the steps left) outweigh its cost;
    never for no stop, nor once all have stopped."""
    from mixzoo.train.stacked import REBUILD_STEPS, worth_compacting
    assert REBUILD_STEPS == {False: 2, True: 50}
    assert worth_compacting(3, 2, 6, False) and not worth_compacting(3, 2, 5, False)
    # MAD's sweep (2000 steps, validation every 250), K = 6 graphed: one stop until step 1500, two at 1750
    assert worth_compacting(6, 5, 500, True) and not worth_compacting(6, 5, 250, True)
    assert worth_compacting(6, 4, 250, True)
    assert worth_compacting(16, 15, 1000, True) and not worth_compacting(16, 13, 250, True)
    assert worth_compacting(16, 12, 250, True)
    assert not worth_compacting(4, 4, 1000, False) and not worth_compacting(4, 0, 1000, False)


def test_an_interrupt_from_one_run_s_on_eval_stops_them_all():
    """Ctrl-C or SIGTERM raised in run 1's on_eval (a signal landing in a journal append there) is
    not run 1's own stop: it reaches the caller, who gives every run of the batch back."""
    cfgs = [TrainConfig(lr=lr, weight_decay=wd, **BASE) for lr, wd in HP]
    seen = []

    def hook(step, val):
        seen.append(step)
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train_stacked(TASK, "softmax", {}, MCFG, cfgs, SEEDS, device="cpu", on_eval=[None, hook, None])
    assert seen == [4]


def test_configurations_must_differ_only_in_seed_lr_weight_decay():
    a = TrainConfig(**BASE)
    with pytest.raises(UsageError, match="differ in batch_size"):
        train_stacked(TASK, "softmax", {}, MCFG, [a, TrainConfig(**{**BASE, "batch_size": 8})], [0, 1], device="cpu")
    with pytest.raises(UsageError, match="differ in optimizer"):
        train_stacked(TASK, "softmax", {}, MCFG, [a, TrainConfig(optimizer="muon", **BASE)], [0, 1], device="cpu")
    with pytest.raises(UsageError, match="compile='reduce-overhead'"):
        train_stacked(TASK, "softmax", {}, MCFG, [TrainConfig(compile="reduce-overhead", **BASE)], [0], device="cpu")
    with pytest.raises(UsageError, match="2 configurations but 1 seeds"):
        train_stacked(TASK, "softmax", {}, MCFG, [a, a], [0], device="cpu")


def test_train_with_step_mode_stacked_is_one_stacked_run():
    """loop.train dispatches step_mode=stacked to a stack of one; its numbers are the eager run's."""
    eager = train(TASK, "linear", {}, MCFG, TrainConfig(**BASE), seed=3, device="cpu")
    st = train(TASK, "linear", {}, MCFG, TrainConfig(step_mode="stacked", **BASE), seed=3, device="cpu")
    assert st.step_mode == "stacked" and st.step_mode_reason == ""
    assert all(_close(a["train_loss"], b["train_loss"]) for a, b in zip(eager.history, st.history))
    assert math.isfinite(st.test["loss"]) and _close(eager.test["loss"], st.test["loss"])


class _CumOp(torch.autograd.Function):
    """o = cumsum_t(q * v) * a[h] on (B, T, H, D): an autograd.Function functorch cannot enter (ctx in forward, like
    fla's), with a per-head parameter; its backward returns fresh contiguous gradients, as a Triton op's does."""

    @staticmethod
    def forward(ctx, q, v, a):
        ctx.save_for_backward(q, v, a)
        return (q * v).cumsum(1) * a[:, None]

    @staticmethod
    def backward(ctx, do):
        q, v, a = ctx.saved_tensors
        g = (do * a[:, None]).flip(1).cumsum(1).flip(1)
        return g * v, g * q, (do * (q * v).cumsum(1)).sum((0, 1, 3))


def _cum_op(q, v, *, a):
    return _CumOp.apply(q, v, a), None


def test_vmap_folds_a_custom_op_into_batch_or_heads():
    """A custom op with a per-head parameter under vmap through ``foldable``: the same outputs and gradients as a
    loop over the models, folding into the heads (a per-model (H,) parameter) or into the batch (none)."""
    from torch.func import vmap

    from mixzoo.train.vmapfold import FoldError, FoldSpec, foldable
    op = _cum_op
    torch.manual_seed(0)
    K, B, T, H, D = 3, 2, 5, 4, 3
    q, v = torch.randn(K, B, T, H, D, dtype=torch.float64, requires_grad=True), torch.randn(K, B, T, H, D, dtype=torch.float64)
    a = torch.randn(K, H, dtype=torch.float64, requires_grad=True)
    ref = torch.stack([op(q[k], v[k], a=a[k])[0] for k in range(K)])
    gq, ga = torch.autograd.grad(ref.square().sum(), (q, a))
    heads = foldable(op, "op", FoldSpec(frozenset({"a"})))
    out = vmap(lambda q, v, a: heads(q, v, a=a)[0])(q, v, a)
    torch.testing.assert_close(out, ref)
    for got, want in zip(torch.autograd.grad(out.square().sum(), (q, a)), (gq, ga)):
        torch.testing.assert_close(got, want)
    shared = a[0].detach()                       # one parameter for every model: folds into the batch
    batch = foldable(op, "op")
    out = vmap(lambda q, v: batch(q, v, a=shared)[0])(q, v)
    torch.testing.assert_close(out, torch.stack([op(q[k], v[k], a=shared)[0] for k in range(K)]))
    with pytest.raises(FoldError, match="needs a FoldSpec"):      # a per-model parameter not declared
        vmap(lambda q, v, a: batch(q, v, a=a)[0])(q, v, a)
    assert batch(q[0], v[0], a=shared)[0].shape == (B, T, H, D)  # outside vmap: the op itself


@pytest.mark.parametrize("mode", ["views", "contiguous"])
def test_heads_fold_hands_gradients_back_contiguous_for_a_split_s_cat(mode, monkeypatch):
    """Mamba-2's pattern: the op's inputs are pieces of one projection's split, folded into the op's heads. With
    ``MIXZOO_FOLD_HEADS_GRAD=contiguous`` every piece's gradient reaches the split's backward (a cat) contiguous (the
    default hands it strided views of the op's folded gradient); the numbers are the loop's either way."""
    from torch.func import vmap
    from torch.utils._python_dispatch import TorchDispatchMode

    from mixzoo.train.vmapfold import FoldSpec, foldable
    monkeypatch.setenv("MIXZOO_FOLD_HEADS_GRAD", mode)
    torch.manual_seed(0)
    K, B, T, H, D = 3, 2, 5, 4, 3
    x = torch.randn(K, B, T, 2 * H * D, dtype=torch.float64, requires_grad=True)
    a = torch.randn(K, H, dtype=torch.float64, requires_grad=True)

    def layer(op, x, a):
        q, v = x.split(H * D, dim=-1)
        return op(q.view(B, T, H, D), v.view(B, T, H, D), a=a)[0]

    ref = torch.stack([layer(_cum_op, x[k], a[k]) for k in range(K)])
    want = torch.autograd.grad(ref.square().sum(), (x, a))
    heads = foldable(_cum_op, "op", FoldSpec(frozenset({"a"})))
    out = vmap(lambda x, a: layer(heads, x, a))(x, a)
    torch.testing.assert_close(out, ref)

    class Cats(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.cat.default:
                self.seen.append([t.is_contiguous() for t in args[0]])
            return func(*args, **(kwargs or {}))

    with Cats() as cats:
        got = torch.autograd.grad(out.square().sum(), (x, a))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert cats.seen, "the split's backward is a cat"
    split_cats = [c for c in cats.seen if len(c) == 2]
    assert split_cats and all(all(c) for c in split_cats) == (mode == "contiguous"), cats.seen


@pytest.mark.parametrize("mode,calls", [(None, [4, 4, 4]), ("per-model", [4, 4, 4]), ("whole", [12])])
def test_mesa_s_op_runs_one_model_a_call_or_folds_its_heads(mode, calls, monkeypatch):
    """fla's chunk_mesa_net (per-head lamb) under vmap: one call a model (the default), or (``MIXZOO_MESA_FOLD=whole``)
    a heads fold of the K models; outputs and gradients equal a loop over the models either way, the output in the
    stacked layout, the final states (None) passed through."""
    from torch.func import vmap

    from mixzoo.train import vmapfold
    if mode is None:
        monkeypatch.delenv("MIXZOO_MESA_FOLD", raising=False)
    else:
        monkeypatch.setenv("MIXZOO_MESA_FOLD", mode)
    T = 6
    heads = []

    def chunk_mesa_net(q, k, v, g, beta, lamb, output_final_state=False):
        heads.append(q.shape[2])
        w = lamb[None, None] * beta[..., None]                              # (B, T, H, D)
        return (q * k * v * w).cumsum(1) * g.exp()[..., None], None, None
    K, B, H, D = 3, 2, 4, 3
    g0 = torch.Generator().manual_seed(0)
    r = lambda *sh: torch.randn(*sh, generator=g0, dtype=torch.float64, requires_grad=True)   # noqa: E731
    q, k, v, g, beta, lamb = r(K, B, T, H, D), r(K, B, T, H, D), r(K, B, T, H, D), r(K, B, T, H), r(K, B, T, H), r(K, H, D)
    ins = (q, k, v, g, beta, lamb)
    op = vmapfold.foldable(chunk_mesa_net)
    out, hk, hv = vmap(lambda *a: op(*a[:5], lamb=a[5]), out_dims=(0, None, None))(*ins)
    assert heads == calls and hk is None and hv is None and out.shape == (K, B, T, H, D)
    ref = torch.stack([chunk_mesa_net(*(t[i] for t in ins))[0] for i in range(K)])
    torch.testing.assert_close(out, ref)
    dy = torch.randn(ref.shape, generator=g0, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad(out, ins, dy), torch.autograd.grad(ref, ins, dy)):
        torch.testing.assert_close(got, want)


def test_gdn_s_fused_gate_is_rewritten_to_fold_into_the_batch():
    """fla's chunk_gated_delta_rule with its gate in the kernel (per-model A_log, dt_bias of shape (H,))
    is called, under vmap, with the gate computed outside: one call on K*B sequences, the numbers of a
    loop over the models calling it with the gate inside."""
    import torch.nn.functional as F
    from torch.func import vmap

    from mixzoo.train.vmapfold import foldable

    class Core(torch.autograd.Function):       # o = v * cumsum_t(g), (B, T, H, D); ctx in forward
        @staticmethod
        def forward(ctx, v, g):
            assert v.shape[0] == 6 or not torch._C._are_functorch_transforms_active()
            ctx.save_for_backward(v, g)
            return v * g.cumsum(1)[..., None]

        @staticmethod
        def backward(ctx, do):
            v, g = ctx.saved_tensors
            return do * g.cumsum(1)[..., None], (do * v).sum(-1).flip(1).cumsum(1).flip(1)

    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, use_gate_in_kernel=False,
                               A_log=None, dt_bias=None):
        if use_gate_in_kernel:
            g = -A_log.float().exp() * F.softplus(g.float() + dt_bias)
        return Core.apply(v, g), None

    torch.manual_seed(0)
    K, B, T, H, D = 3, 2, 5, 4, 3
    v, a = torch.randn(K, B, T, H, D, requires_grad=True), torch.randn(K, B, T, H, requires_grad=True)
    A_log, dt = torch.randn(K, H, requires_grad=True), torch.randn(K, H, requires_grad=True)
    ref = torch.stack([chunk_gated_delta_rule(v[k], v[k], v[k], g=a[k], use_gate_in_kernel=True, A_log=A_log[k],
                                              dt_bias=dt[k])[0] for k in range(K)])
    want = torch.autograd.grad(ref.square().sum(), (v, a, A_log, dt))
    op = foldable(chunk_gated_delta_rule)
    out = vmap(lambda v, a, A, d: op(v, v, v, g=a, scale=1.0, use_gate_in_kernel=True, A_log=A, dt_bias=d)[0])(
        v, a, A_log, dt)
    torch.testing.assert_close(out, ref)
    for got, w in zip(torch.autograd.grad(out.square().sum(), (v, a, A_log, dt)), want):
        torch.testing.assert_close(got, w)


def test_folding_sends_sdpa_through_one_call():
    """Under ``folding()``, SDPA inside vmap is one call on the folded batch (no per-model loop,
    which CPU SDPA's missing batching rule would warn about), equal to the loop; outside, unchanged."""
    import warnings

    import torch.nn.functional as F
    from torch.func import vmap

    from mixzoo.train.vmapfold import folding
    orig = F.scaled_dot_product_attention
    q = torch.randn(3, 2, 2, 6, 4)
    with folding(), warnings.catch_warnings():
        warnings.simplefilter("error")
        out = vmap(lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True))(q)
    assert F.scaled_dot_product_attention is orig
    torch.testing.assert_close(out, torch.stack([orig(x, x, x, is_causal=True) for x in q]))


def test_short_convolution_under_vmap_keeps_autocast_s_dtype():
    """vmap (stacked training) bypasses autocast's casts of conv1d (CUDA: a bf16 input against a
    float32 bias fails; CPU: the conv runs in float32): ShortConv makes the casts itself, so the
    stacked models run the eager models' bf16 convolution."""
    from torch.func import functional_call, stack_module_state, vmap

    from mixzoo.models.common import ShortConv
    torch.manual_seed(0)
    ms = [ShortConv(8, 4) for _ in range(3)]
    params, bufs = stack_module_state(ms)
    x = torch.randn(3, 2, 10, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = vmap(lambda p, b, xi: functional_call(ms[0], (p, b), (xi,)))(params, bufs, x)
        ref = torch.stack([m(x[i]) for i, m in enumerate(ms)])
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref.float(), atol=1.6e-2, rtol=1.6e-2)


def test_folding_runs_rms_norm_once_on_every_model_s_rows():
    """vmap has no batching rule for F.rms_norm (functorch decomposes it into elementwise operators,
    where CUDA has one fused kernel): under ``folding()`` it is one call of F.rms_norm on a plain
    tensor holding every model's rows, without weight, the per-model weight applied after; the
    numbers, and gradients, of a loop over the models. Outside vmap F.rms_norm is called as is."""
    import torch.nn.functional as F
    from torch.func import vmap

    from mixzoo.train.vmapfold import folding
    seen = []
    real = F.rms_norm

    def spy(x, shape, weight=None, eps=None):
        seen.append((torch._C._functorch.is_batchedtensor(x), tuple(x.shape), weight is None))
        return real(x, shape, weight, eps)

    torch.manual_seed(0)
    K, B, T, D = 3, 2, 5, 8
    x = torch.randn(K, B, T, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(K, D, dtype=torch.float64, requires_grad=True)
    ref = torch.stack([real(x[k].transpose(0, 1), (D,), w[k], 1e-6) for k in range(K)])
    want = torch.autograd.grad(ref.square().sum(), (x, w))
    F.rms_norm = spy
    try:
        with folding():
            out = vmap(lambda x, w: F.rms_norm(x.transpose(0, 1), (D,), w, 1e-6))(x, w)   # batch dim inside
            bare = vmap(lambda x: F.rms_norm(x, [D]), in_dims=1)(x)                          # vmapped over B
            assert seen == [(False, (K, T, B, D), True), (False, (B, K, T, D), True)]
            seen.clear()
            F.rms_norm(x[0], (D,), w[0], 1e-6)
            assert seen == [(False, (B, T, D), False)]
    finally:
        F.rms_norm = real
    torch.testing.assert_close(out, ref)
    for got, g in zip(torch.autograd.grad(out.square().sum(), (x, w)), want):
        torch.testing.assert_close(got, g)
    torch.testing.assert_close(bare, torch.stack([real(x[:, b], (D,)) for b in range(B)]))
