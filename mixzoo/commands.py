"""Commands ``demo``, ``tasks``, ``models`` and ``run``."""
from __future__ import annotations

import sys
import time

from .errors import UsageError


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out = {}
    for it in items or []:
        if "=" not in it or not it.split("=", 1)[0]:
            raise UsageError(f"{what} {it!r} is not KEY=VALUE")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def literal(v: str):
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, else the string."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def configure(name: str, p) -> None:
    if name == "run":
        p.add_argument("task", help="task name (see 'mixzoo tasks')")
        p.add_argument("--model", "-m", required=True, help="mechanism (see 'mixzoo models')")
        p.add_argument("--set", action="append", metavar="KNOB=V", help="task knob")
        p.add_argument("--hp", action="append", metavar="KEY=V",
                       help="hyperparameter: trainer (steps, lr...), model (d_model...) or mechanism knob")
        p.add_argument("--preset", help="task preset (see 'mixzoo tasks')")
        p.add_argument("--recipe", default="zoology", help="backbone recipe: zoology or mad")
        p.add_argument("--seed", type=int, action="append", help="seed (repeatable; default 0)")
        p.add_argument("--lr", type=float)
        p.add_argument("--optimizer", choices=("adamw", "muon"),
                       help="adamw (default) or muon: Muon for hidden matrices, AdamW for the rest")
        p.add_argument("--schedule", choices=("cosine", "wsd"), help="learning-rate schedule (default cosine)")
        p.add_argument("--steps", type=int)
        p.add_argument("--batch-size", type=int)
        p.add_argument("--d-model", type=int)
        p.add_argument("--allow-noncausal", action="store_true",
                       help="run a mechanism that fails the causality check (the rows record it)")
    elif name == "demo":
        p.add_argument("--steps", type=int, default=None, help="training steps per model")
    elif name in ("tasks", "models"):
        p.add_argument("names", nargs="*", help="only these")


def main(args) -> int:
    return {"demo": demo, "tasks": list_tasks, "models": list_models, "run": run}[args.command](args)


def _log(msg: str) -> None:
    print(msg, flush=True)


# the flags that set a hyperparameter; the same key in --hp must agree
FLAG_KEYS = (("lr", "--lr"), ("steps", "--steps"), ("batch_size", "--batch-size"), ("d_model", "--d-model"),
             ("optimizer", "--optimizer"), ("schedule", "--schedule"))


def run(args) -> int:
    from .api import coerce_hparams, command_line
    from .api import run as api_run
    raw = parse_pairs(args.hp, "--hp")
    hp = coerce_hparams(args.model, raw, label="--hp")
    for key, flag in FLAG_KEYS:
        val = getattr(args, key)
        if val is None:
            continue
        if key in hp and hp[key] != val:
            raise UsageError(f"{flag} {val} conflicts with --hp {key}={raw[key]}; give one of them")
        hp[key] = val
    rows = api_run(args.task, args.model, knobs=parse_pairs(args.set, "--set"),
                   preset=args.preset, hparams=hp, recipe=args.recipe,
                   seeds=args.seed or [0], results=args.results, device=args.device,
                   command=command_line(), log=_log, allow_noncausal=args.allow_noncausal)
    from .leaderboard.views import print_rows
    print_rows(rows)
    print(f"rows written under {args.results}/leaderboard/", flush=True)
    failed = [r for r in rows if r["state"] != "COMPLETE"]
    for r in failed:    # one line each; the traceback, if any, went to the log above
        print(f"mixzoo: run failed: {r['model']} on {r['task']} seed {r['seed']}: {r['state']}: "
              f"{r.get('state_reason') or 'no reason given'}", file=sys.stderr, flush=True)
    return 1 if failed else 0


# Based recipe (a short-convolution layer, then two mixer layers), fresh examples every step.
DEMO_HP = dict(steps=400, batch_size=64, lr=1e-2, weight_decay=0.1, warmup_frac=0.02, eval_every=50,
               d_model=64, num_heads=4, n_layers=2, n_val=256, n_test=512)


def demo(args) -> int:
    """Small MQAR models with softmax and LLA on CPU, landed in the leaderboard."""
    from .api import check_results_dir, command_line
    from .api import run as api_run
    from .leaderboard import read_table
    from .leaderboard.views import print_summary
    hp = dict(DEMO_HP)
    if args.steps is not None:
        hp["steps"] = args.steps
    hp["n_train"] = hp["steps"] * hp["batch_size"]
    check_results_dir(args.results)
    t0 = time.time()
    print(f"mixzoo demo: MQAR (preset 'demo': vocab 32, length 32, 4 key-value pairs), softmax attention "
          f"and Local Linear Attention, {hp['steps']} steps each at batch {hp['batch_size']}, d_model "
          f"{hp['d_model']}, {hp['n_layers']} mixer layers after a short convolution (Based recipe)", flush=True)
    for model in ("softmax", "lla"):
        api_run("mqar", model, preset="demo", hparams=hp, recipe="based", seeds=[0], results=args.results,
                device=args.device, command=command_line(), log=_log)
    table = read_table(args.results)
    print()
    print_summary(table, task="mqar")
    print(f"\ndone in {time.time() - t0:.0f} s; leaderboard rows are under "
          f"{args.results}/leaderboard/ (try 'mixzoo --results {args.results} leaderboard show')")
    return 0


def list_tasks(args) -> int:
    import dataclasses

    from .registry import tasks
    reg = tasks()
    for name in args.names:
        if name not in reg:
            raise UsageError(f"unknown task {name!r}; allowed: {', '.join(reg)}")
    for name, cls in reg.items():
        if args.names and name not in args.names:
            continue
        metrics = ", ".join(f"{m.name}{'↑' if m.higher_is_better else '↓'}" for m in cls.metrics)
        print(f"{name}  (suite {cls.suite}, v{cls.version}, {cls.kind}; metrics: {metrics})")
        for f in dataclasses.fields(cls):
            m = f.metadata
            if m.get("choices") is not None:
                allowed = "{" + ", ".join(map(str, m["choices"])) + "}"
            elif isinstance(f.default, bool):
                allowed = "{true, false}"
            elif m.get("lo") is None and m.get("hi") is None:
                allowed = ""
            else:
                lo, hi = m.get("lo"), m.get("hi")
                allowed = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
            print(f"    {f.name:<20} default {f.default!s:<10} {allowed:<22} {m.get('help', '')}")
        if cls.presets:
            print(f"    presets: {', '.join(cls.presets)}")
    return 0


def list_models(args) -> int:
    import torch

    from .registry import build_mixer, mixers
    reg = mixers()
    for name in args.names:
        if name not in reg:
            raise UsageError(f"unknown mechanism {name!r}; allowed: {', '.join(reg)}")
    d, h, T = 128, 2, 1024
    print(f"{'mechanism':<12} {'params@d128':>12} {'state@T1024':>12}  {'backend here':<16} search space")
    for name, spec in reg.items():
        if args.names and name not in args.names:
            continue
        try:
            m = build_mixer(spec, d, num_heads=h, layer_idx=0, l_max=T)
            n = sum(p.numel() for p in m.parameters())
            st = m.state_size(T) if hasattr(m, "state_size") else None
            with torch.no_grad():
                m(torch.randn(1, 8, d))
            backend = getattr(m, "backend", spec.impl.__name__)
        except Exception as e:  # a plugin that cannot build at d=128 is still listed
            n, st, backend = None, None, f"error: {type(e).__name__}"
        space = ", ".join(f"{k}~{v[0]}" for k, v in spec.search_space.items())
        print(f"{name:<12} {n if n is not None else '-':>12} {st if st is not None else '-':>12}  "
              f"{backend:<16} {space}")
    print(f"(one layer, d_model {d}, {h} heads; state in numbers at length {T}, "
          f"backend as chosen on this machine for a CPU input)", file=sys.stdout)
    return 0
