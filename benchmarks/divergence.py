"""Find where a training run goes non-finite, and why: train with the per-step capture
(``mixzoo.train.capture.NonFiniteCapture``), then, on the captured step, compare every mixer's fast
path with its float64 reference and, for LLA, describe the estimator (query and key norms, how
peaked the softmax is, the smallest eigenvalue of the weighted key covariance, the boundary
amplification η = (k̄ - q)ᵀ(Σ_KK + λI)⁻¹(k̄ - q), the L1 norm of the effective value weights).

    python benchmarks/divergence.py CASE [--model M] [--steps N] [--out DIR] [--hp k=v ...]

Cases (the configurations of the GPU reports; ``--hp`` overrides any key):
  mqar512   mqar V=8192 L=512 kv=32, zoology recipe, d_model 128, 2 heads, batch 128, lr 3e-3, 4000 steps
  mqar512d64  the same at d_model 64
  state48   state-tracking N=48, d_model 128, 2 layers, batch 128, lr 1e-3, 10000 steps
  selcopy   mad-selective-copy, mad recipe, lr 1e-3, 4000 steps (mamba's NaN)
Prints one summary; writes the capture and a JSON report under --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

from mixzoo.api import make_task, split_hparams
from mixzoo.commands import literal, parse_pairs
from mixzoo.models import build_model, mixers_of
from mixzoo.train import train
from mixzoo.train.capture import NonFiniteCapture, replay_mixer

CASES = {
    "mqar512": dict(task="mqar", knobs=dict(V=8192, L=512, kv=32), recipe="zoology",
                    hp=dict(d_model=128, num_heads=2, batch_size=128, lr=3e-3, steps=4000, eval_every=250)),
    "mqar512d64": dict(task="mqar", knobs=dict(V=8192, L=512, kv=32), recipe="zoology",
                       hp=dict(d_model=64, num_heads=2, batch_size=128, lr=3e-3, steps=4000, eval_every=250)),
    "state48": dict(task="state-tracking", knobs=dict(N=48), recipe="zoology",
                    hp=dict(d_model=128, num_heads=2, n_layers=2, batch_size=128, lr=1e-3, steps=10000,
                            eval_every=500)),
    "selcopy": dict(task="mad-selective-copy", knobs={}, recipe="mad",
                    hp=dict(lr=1e-3, steps=4000, eval_every=250)),
}


def quantiles(t: torch.Tensor) -> dict[str, float]:
    t = t.double().flatten()
    t = t[torch.isfinite(t)]
    if t.numel() == 0:
        return {}
    if t.numel() > 1_000_000:
        t = t[torch.randperm(t.numel(), device=t.device)[:1_000_000]]
    qs = torch.quantile(t, torch.tensor([0.5, 0.99], dtype=t.dtype, device=t.device))
    return {"p50": float(qs[0]), "p99": float(qs[1]), "max": float(t.max()), "min": float(t.min())}


@torch.no_grad()
def lla_estimator_stats(layer, x: torch.Tensor, n_seq: int = 4) -> dict[str, dict]:
    """The estimator at the captured input, in float64, for the first ``n_seq`` sequences of ``x``."""
    from mixzoo.kernels.lla.reference import _causal_softmax, _solve_directions
    from mixzoo.models.common import rope, split_heads
    m = copy.deepcopy(layer).double()
    x = x[:n_seq].double()
    q, k, v = (split_heads(t, m.h) for t in m.qkv(x).chunk(3, dim=-1))
    if m.use_rope:
        q, k = rope(q), rope(k)
    lam = m.ridge().double()[None, :, None]
    D = q.shape[-1]
    a = _causal_softmax(q, k, D ** -0.5, 0)                                   # (B, H, T, T)
    y, kbar = _solve_directions(q, k, a, lam)
    kk = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2)
    cov = (a @ kk).unflatten(-1, (D, D)) - kbar.unsqueeze(-1) * kbar.unsqueeze(-2)
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    fin = torch.isfinite(cov).all(-1).all(-1)
    try:
        eig_min = torch.linalg.eigvalsh(cov[fin])[..., 0]
    except RuntimeError:                      # eigh itself can fail on wild matrices: say so
        eig_min = torch.full((1,), float("nan"))
    eta = ((kbar - q) * y).sum(-1)
    w = a * (1 - (k @ y.transpose(-1, -2)).transpose(-1, -2) + (kbar * y).sum(-1, keepdim=True))
    vbar = a @ v
    o = w @ v
    return {"ridge": quantiles(lam), "q_norm": quantiles(q.norm(dim=-1)), "k_norm": quantiles(k.norm(dim=-1)),
            "v_norm": quantiles(v.norm(dim=-1)),
            "nonfinite_cov_rows": {"n": float((~fin).sum())}, "a_max": quantiles(a.max(-1).values),
            "kbar_minus_q": quantiles((kbar - q).norm(dim=-1)), "cov_eig_min": quantiles(eig_min),
            "eta": quantiles(eta), "y_norm": quantiles(y.norm(dim=-1)), "weights_l1": quantiles(w.abs().sum(-1)),
            "o_over_vbar": quantiles(o.norm(dim=-1) / vbar.norm(dim=-1).clamp_min(1e-30))}


def _bh_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| per (sequence, head) of a (B, H, T, D) tensor, non-finite as inf."""
    return t.float().abs().nan_to_num(float("inf")).amax((-1, -2))


def lla_launch_experiment(layer, x: torch.Tensor, grad_out: torch.Tensor, device, save: Path,
                          chunk: int = 16) -> dict:
    """Which launch of LLA's kernel goes wrong on a captured step, and whether it depends on the launch.

    The mixer is run whole on every captured sequence under bf16 autocast (as trained) with the
    kernel's entry point wrapped so that the exact q, k, v, ridge and output gradient it saw, and the
    dq, dk, dv it returned, are kept. On those exact inputs the kernel is then rerun: once more at the
    full launch (determinism), ``chunk`` sequences a launch, the worst sequence alone, and the worst
    sequence copied into every slot of a full launch; and the float64 estimator on the worst sequence.
    (2026-12-01, H200: chunks of 16 matched float64 while the training step's launch of 128 sequences
    gave gradients of 1e18.) The worst sequence's inputs go to ``save``; the whole launch's inputs to
    ``save`` with suffix .full.pt (for compute-sanitizer; large)."""
    from mixzoo.kernels.lla import lla_reference, triton_lla
    m = copy.deepcopy(layer).to(device)
    rec: dict = {}
    orig = triton_lla.lla

    def spy(q, k, v, *, ridge, prec=None, **kw):
        rec.update(q=q.detach().clone(), k=k.detach().clone(), v=v.detach().clone(),
                   ridge=ridge.detach().clone() if torch.is_tensor(ridge) else ridge, prec=prec, kw=kw)
        for nm, t in (("dq", q), ("dk", k), ("dv", v)):
            if t.requires_grad:
                t.register_hook(lambda gr, nm=nm: rec.__setitem__(nm, gr.detach().clone()))
        o = orig(q, k, v, ridge=ridge, prec=prec, **kw)
        o.register_hook(lambda gr: rec.__setitem__("go", gr.detach().clone()))
        return o

    triton_lla.lla = spy
    try:
        xi = x.detach().to(device, torch.float32).clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = m(xi)
        (o.float() * grad_out.to(device).float()).sum().backward()
    finally:
        triton_lla.lla = orig
    q, k, v, go, ridge, prec = rec["q"], rec["k"], rec["v"], rec["go"], rec["ridge"], rec["prec"]
    B = q.shape[0]

    def kernel(sl_q, sl_k, sl_v, sl_g, sl_r):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (sl_q, sl_k, sl_v))
        orig(qq, kk, vv, ridge=sl_r, prec=prec, **rec["kw"]).backward(sl_g)
        torch.cuda.synchronize()
        return {"dq": qq.grad, "dk": kk.grad, "dv": vv.grad}

    def rsl(s):
        return ridge[s] if torch.is_tensor(ridge) and ridge.dim() and ridge.shape[0] == B else ridge

    runs = {"module": {n: rec[n] for n in ("dq", "dk", "dv")},
            "full_again": kernel(q, k, v, go, ridge)}
    parts = [kernel(q[s:s + chunk], k[s:s + chunk], v[s:s + chunk], go[s:s + chunk], rsl(slice(s, s + chunk)))
             for s in range(0, B, chunk)]
    runs[f"chunks_of_{chunk}"] = {n: torch.cat([p[n] for p in parts]) for n in ("dq", "dk", "dv")}
    stats = {name: {n: _bh_max(t) for n, t in r.items()} for name, r in runs.items()}
    worst_val, worst_at = -1.0, (0, 0, "dq")
    for n, t in stats["module"].items():
        val, idx = t.flatten().max(0)
        if float(val) > worst_val:
            worst_val, worst_at = float(val), (*divmod(int(idx), t.shape[1]), n)
    b, h, nm = worst_at
    one = slice(b, b + 1)
    runs_b = {"alone": kernel(q[one], k[one], v[one], go[one], rsl(one)),
              "copied_into_full": kernel(*(t[one].expand_as(t).contiguous() for t in (q, k, v, go)), ridge)}
    lam_h = float(ridge[b, h, 0] if torch.is_tensor(ridge) and ridge.dim() == 3 else
                  torch.as_tensor(ridge).flatten()[0])
    qq, kk, vv = (t[b, h].double().requires_grad_(True) for t in (q, k, v))
    lla_reference(qq[None], kk[None], vv[None], ridge=lam_h)[0].backward(go[b, h].double())
    ref = {"dq": qq.grad, "dk": kk.grad, "dv": vv.grad}
    out = {"B": B, "prec": prec, "ridge": lam_h, "worst": {"sequence": b, "head": h, "grad": nm, "value": worst_val},
           "max": {name: {n: float(t.max()) for n, t in st.items()} for name, st in stats.items()},
           "worst_seq": {}}
    for name in stats:
        top = stats[name][nm].flatten().argsort(descending=True)[:3].tolist()
        out["max"][name]["top_" + nm] = [(*divmod(i, stats[name][nm].shape[1]), float(stats[name][nm].flatten()[i]))
                                         for i in top]
    for name, r in (*((n, {g: t[b] for g, t in rr.items()}) for n, rr in runs.items()),
                    ("alone", {g: t[0] for g, t in runs_b["alone"].items()}),
                    ("copied_into_full_slot0", {g: t[0] for g, t in runs_b["copied_into_full"].items()}),
                    ("copied_into_full_max", {g: t for g, t in runs_b["copied_into_full"].items()})):
        out["worst_seq"][name] = {g: float(t[h].float().abs().nan_to_num(float("inf")).max()) if t.dim() == 3
                                  else float(t.float().abs().nan_to_num(float("inf")).max()) for g, t in r.items()}
    out["worst_seq"]["f64"] = {g: float(t.abs().max()) for g, t in ref.items()}
    row = runs["module"][nm][b, h].float().abs().nan_to_num(float("inf")).amax(-1)
    out["worst_rows"] = [(int(t), float(row[t]), float(ref[nm][t].abs().max()))
                         for t in row.argsort(descending=True)[:5].tolist()]
    torch.save({"q": q[b].cpu(), "k": k[b].cpu(), "v": v[b].cpu(), "go": go[b].cpu(), "head": h, "ridge": lam_h,
                "prec": prec, "kw": rec["kw"], "module_grads": {g: t[b].cpu() for g, t in runs["module"].items()}},
               save)
    torch.save({"q": q.cpu(), "k": k.cpu(), "v": v.cpu(), "go": go.cpu(),
                "ridge": ridge.cpu() if torch.is_tensor(ridge) else ridge, "prec": prec, "kw": rec["kw"]},
               save.with_suffix(".full.pt"))
    return out


def analyse(capture_path: Path, case: dict, model_name: str, knobs: dict, device) -> dict:
    rec = torch.load(capture_path, weights_only=False)
    task = make_task(case["task"], case["knobs"])
    _, mcfg, mix = split_hparams(case["hp"], case["recipe"])
    model = build_model(task.backbone, model_name, {**mix, **knobs}, mcfg,
                        vocab=task.vocab_size if task.kind == "classification" else 0,
                        d_in=task.d_in, d_out=task.d_out)
    model.load_state_dict(rec["state_dict"])
    out = {"step": rec["step"], "loss": rec["loss"], "first_forward": rec["forward"],
           "first_backward": rec["backward"], "nonfinite_grads": rec["nonfinite_grads_in_step"][:20],
           "forward_max_abs": dict(sorted(rec["forward_max_abs"].items(), key=lambda kv: -kv[1])[:12]),
           "backward_max_abs": dict(sorted(rec["backward_max_abs"].items(), key=lambda kv: -kv[1])[:12]),
           "grad_norms_in_step": dict(sorted(rec["grad_norms_in_step"].items(), key=lambda kv: -kv[1])[:12]),
           "grad_norms_replay": dict(sorted(rec["grad_norms"].items(), key=lambda kv: -kv[1])[:12]),
           "mixers": []}
    for i, mixer in enumerate(mixers_of(model)):
        if i not in rec["mixer_in"] or i not in rec["mixer_grad_out"]:
            continue
        x, g = rec["mixer_in"][i], rec["mixer_grad_out"][i]
        r = {"layer": i, "input_finite": bool(torch.isfinite(x).all()), "grad_out_finite": bool(torch.isfinite(g).all())}
        worst = list(range(min(4, len(x))))
        if model_name == "lla":
            try:
                r["launch"] = lla_launch_experiment(mixer, x, g, device, capture_path.parent / f"lla-worst-layer{i}.pt")
                worst = [r["launch"]["worst"]["sequence"]]
            except Exception as e:
                r["launch_error"] = f"{type(e).__name__}: {e}"
        try:
            n = min(16, len(x)) if model_name == "lla" else len(x)   # the float64 LLA estimator on 128: OOM
            pick = (worst + [j for j in range(len(x)) if j not in worst])[:n]
            rp = r["replay"] = replay_mixer(mixer, x[pick], g[pick], device=device)
            fast = torch.tensor(rp["fast_dx_max_per_example"])
            if model_name != "lla":
                worst = fast.nan_to_num(float("inf")).argsort(descending=True)[:4].tolist()
            pos = {j: n_ for n_, j in enumerate(pick)}     # sequence -> its place in the replayed batch
            r["worst_examples"] = {i: (rp["fast_dx_max_per_example"][pos[i]], rp["f64_dx_max_per_example"][pos[i]])
                                   for i in worst if i in pos}
        except Exception as e:  # the report says what failed rather than stopping the analysis
            r["replay_error"] = f"{type(e).__name__}: {e}"
        if model_name == "lla":
            r["estimator"] = lla_estimator_stats(mixer.to(device), x.to(device))
            r["estimator_worst"] = lla_estimator_stats(mixer.to(device), x[worst].to(device))
        out["mixers"].append(r)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--model", default="lla")
    p.add_argument("--steps", type=int)
    p.add_argument("--stop-at", type=int, help="stop training at this step, the schedule still that of --steps "
                   "(the trajectory of the full run, cut short)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hp", action="append", metavar="K=V", help="override a hyperparameter or mechanism knob")
    p.add_argument("--out", default="divergence-out")
    a = p.parse_args(argv)
    case = copy.deepcopy(CASES[a.case])
    case["hp"].update({k: literal(v) for k, v in parse_pairs(a.hp, "--hp").items()})
    if a.steps:
        case["hp"]["steps"] = a.steps
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task = make_task(case["task"], case["knobs"])
    tcfg, mcfg, mix = split_hparams(case["hp"], case["recipe"])
    out_dir = Path(a.out) / f"{a.case}-{a.model}-s{a.seed}"
    cap = NonFiniteCapture(out_dir, meta={"case": a.case, "model": a.model, "seed": a.seed, **case})
    callbacks = [cap]
    if a.stop_at:
        import lightning.pytorch as pl

        class StopAt(pl.Callback):
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step >= a.stop_at:
                    trainer.should_stop = True
        callbacks.append(StopAt())
    t0 = time.time()
    tag = f"[{a.case} {a.model} seed {a.seed}]"
    res = train(task, a.model, mix, mcfg, tcfg, seed=a.seed, device=str(dev), callbacks=callbacks,
                log=lambda s: print(tag, s, flush=True))
    report = {"case": a.case, "model": a.model, "seed": a.seed, "hp": case["hp"], "state": res.state,
              "reason": res.reason, "steps": res.steps, "backend": res.backend, "test": res.test,
              "steps_per_s": res.steps_per_s, "wall_s": time.time() - t0,
              "history": [{k: h[k] for k in ("step", "train_loss", task.primary.name) if k in h} for h in res.history]}
    if cap.path is not None:
        report["analysis"] = analyse(cap.path, case, a.model, {}, dev)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(tag, f"state {res.state} after {res.steps} steps ({res.backend}, {res.steps_per_s:.1f} steps/s); "
          f"test {task.primary.name} {res.test.get(task.primary.name, math.nan):.4f}; {res.reason}")
    if "analysis" in report:
        an = report["analysis"]
        print(tag, f"first non-finite forward: {an['first_forward']}; backward: {an['first_backward']}; "
              f"grads: {an['nonfinite_grads'][:4]}")
        for key in ("grad_norms_in_step", "grad_norms_replay", "backward_max_abs", "forward_max_abs"):
            print(tag, key + ": " + ", ".join(f"{k} {v:.3g}" for k, v in list(an[key].items())[:6]))
        for r in an["mixers"]:
            rp = r.get("replay", {})
            print(tag, f"layer {r['layer']}: input finite {r['input_finite']}, grad_out finite {r['grad_out_finite']}; "
                  f"fast ({rp.get('fast_backend')}) vs f64: out finite {rp.get('out_finite')} "
                  f"rel {rp.get('out_rel', math.nan):.3g}, "
                  f"dx finite {rp.get('dx_finite')} rel {rp.get('dx_rel', math.nan):.3g}; f64 out finite "
                  f"{rp.get('ref_out_finite')}, dx finite {rp.get('ref_dx_finite')} {r.get('replay_error', '')}")
            if "launch" in r:
                la = r["launch"]
                print(tag, f"    kernel launch experiment (B={la['B']}, ridge {la['ridge']}, prec {la['prec']}): worst "
                      f"{la['worst']}")
                for name, mx in la["max"].items():
                    print(tag, f"      max over the launch, {name}: " + ", ".join(f"{k} {v}" for k, v in mx.items()))
                for name, mx in la["worst_seq"].items():
                    print(tag, f"      worst sequence, {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in mx.items()))
                print(tag, "      worst rows (t, kernel, f64): " +
                      ", ".join(f"{t}: {a:.3g}/{b:.3g}" for t, a, b in la["worst_rows"]))
            if "launch_error" in r:
                print(tag, "    launch experiment failed:", r["launch_error"])
            if "worst_examples" in r:
                print(tag, "    worst examples (max |dx| fast, f64): " + ", ".join(
                    f"{i}: {a:.3g} / {b:.3g}" for i, (a, b) in r["worst_examples"].items()))
            for which in ("estimator", "estimator_worst"):
                for name, st in r.get(which, {}).items():
                    print(tag, f"    {which[9:] or 'first'} {name:<14} " + " ".join(f"{k} {v:.3g}" for k, v in st.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
