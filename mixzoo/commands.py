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
    from .spec import literal as _literal
    return _literal(v)


def configure(name: str, p) -> None:
    if name == "run":
        p.add_argument("task", nargs="?", help="task name (see 'mixzoo tasks'); or give --spec")
        p.add_argument("--model", "-m", metavar="M[:KEY=V,...]",
                       help="mechanism (see 'mixzoo models'), optionally with its knobs (lla:ridge=2)")
        p.add_argument("--set", action="append", metavar="KEY=V",
                       help="a task knob (kv=4) or a hyperparameter (lr=3e-3, d_model=64, ridge=2); "
                            "qualify to pick the section: task.K, train.K, backbone.K (or model.K), mixer.K")
        p.add_argument("--hp", action="append", metavar="KEY=V",
                       help="the same, never a task knob: trainer (steps, lr...), backbone (d_model...) "
                            "or mechanism knob")
        p.add_argument("--spec", metavar="FILE", help="a run spec file (.toml or .json: the shape of a row's "
                                                      "spec_json); the other options override it")
        p.add_argument("--preset", help="task preset (see 'mixzoo tasks')")
        p.add_argument("--recipe", default=None, help="backbone recipe: zoology (default), based or mad")
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


# the flags that set a hyperparameter: (spec section, key, flag); the same key elsewhere must agree
FLAG_KEYS = (("train", "lr", "--lr"), ("train", "steps", "--steps"), ("train", "batch_size", "--batch-size"),
             ("backbone", "d_model", "--d-model"), ("train", "optimizer", "--optimizer"),
             ("train", "schedule", "--schedule"))


def split_model(text: str) -> tuple[str, list[str]]:
    """``lla:ridge=2,rope=false`` -> ("lla", ["ridge=2", "rope=false"])."""
    name, _, rest = text.partition(":")
    return name.strip(), [it for it in rest.split(",") if it.strip()] if rest else []


def run_spec_of(args):
    """The command line of ``mixzoo run`` as a RunSpec: a thin parser over :func:`mixzoo.spec.build`.
    Every ``KEY=VALUE`` (``--set``, ``--hp``, ``--model M:K=V``, a flag such as ``--lr``) is sorted into
    the spec's sections; a spec file (``--spec``) gives the rest."""
    from .spec import Assignments, assign, build, from_mapping, read_spec_file
    base: dict = {}
    if args.spec:
        where = f"run spec {args.spec}"
        base = from_mapping(read_spec_file(args.spec), where=where)
        if base["task"] and base["model"]:
            build(**base, label=where)          # the file's own values checked, named as the file's
    model_text = args.model or base.get("model")
    task = args.task or base.get("task")
    if not task:
        raise UsageError("run needs a TASK (or --spec FILE naming one); see 'mixzoo tasks'")
    if not model_text:
        raise UsageError("run needs --model M (or --spec FILE naming one); see 'mixzoo models'")
    model, model_knobs = split_model(model_text)
    a = Assignments()
    assign(a, task, model, args.set, "--set")
    assign(a, task, model, args.hp, "--hp", bare="hp")
    assign(a, task, model, model_knobs, f"--model {model}:", bare="mixer")
    for sec, key, flag in FLAG_KEYS:
        val = getattr(args, key)
        if val is not None:
            a.add(sec, key, val, flag, f"{flag} {val}")
    typed = a.resolve(model)
    same_task = base.get("task") in (None, task)
    same_model = base.get("model") in (None, model)
    preset = args.preset if args.preset is not None else (base.get("preset") if same_task else None)
    knobs = {**(base.get("knobs", {}) if same_task and args.preset is None else {}), **typed["task"]}
    return build(task, model, knobs=knobs, preset=preset,
                 train={**base.get("train", {}), **typed["train"]},
                 backbone={**base.get("backbone", {}), **typed["backbone"]},
                 mixer={**(base.get("mixer", {}) if same_model else {}), **typed["mixer"]},
                 recipe=args.recipe or base.get("recipe", "zoology"),
                 seed=(args.seed or [base.get("seed", 0)])[0],
                 allow_noncausal=args.allow_noncausal or base.get("allow_noncausal", False),
                 label=f"run spec {args.spec}" if args.spec else "--hp")


def run(args) -> int:
    from .api import command_line, run_spec
    spec = run_spec_of(args)
    rows = run_spec(spec, seeds=args.seed or [spec.seed], results=args.results, device=args.device,
                    command=command_line(), log=_log)
    from .leaderboard.views import print_rows
    print_rows(rows)
    print(f"rows written under {args.results}/leaderboard/ (curves under {args.results}/curves/)", flush=True)
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
