"""The Parallax paper's MAD experiments (Zuo et al., 2026): the six MAD tasks with every model
trained with Muon, and the harder range (vocabulary up to 512, context up to 2048).

Sources, cited as file:line: ``PR`` = ../shared/reference/paper_results.md, ``TS`` =
../shared/reference/task_specs.md (MAD's own protocol, which the paper's MAD numbers follow but
for the optimizer). The MAD settings are the presets of ``mixzoo.tasks.mad`` (MAD's 66 settings;
the ``hard-`` ones our reading of the harder range).
"""
from __future__ import annotations

from .spec import Aggregate, Choice, Claim, Figure, Ref, Scale, Stated

PAPER = "Parallax paper (Zuo et al., 2026)"
MAD_TASKS = ("mad-compression", "mad-fuzzy-recall", "mad-recall", "mad-memorization", "mad-noisy-recall",
             "mad-selective-copy")
PAPER5 = ("parallax", "softmax", "gdn", "mesa", "mamba")               # PR:49-55
BASELINES = ("softmax", "gdn", "mesa", "mamba")

# MAD's 66 settings as the tasks' presets (mixzoo/tasks/mad.py: baseline, then one axis at a time)
_AXES = {
    "mad-recall": ("V32", "V64", "V128", "L256", "L512", "L1024", "n6400", "n3200", "n1600", "n800"),
    "mad-fuzzy-recall": ("V32", "V64", "V128", "L256", "L512", "L1024", "n6400", "n3200", "n1600", "n800"),
    "mad-noisy-recall": ("V48", "V80", "V144", "L256", "L512", "L1024", "n6400", "n3200", "n1600", "n800",
                         "noise0.4", "noise0.6", "noise0.8"),
    "mad-selective-copy": ("V32", "V64", "V128", "L512", "L1024", "n6400", "n3200", "n1600", "n800", "copy32",
                           "copy64", "copy96"),
    "mad-compression": ("V32", "V64", "V128", "L64", "L128", "L256", "n6400", "n3200", "n1600", "n800"),
    "mad-memorization": ("V512", "V1024", "V2048", "V4096", "V8192"),
}
_HARD = {
    "mad-recall": ("hard-V256", "hard-V512", "hard-L2048"),
    "mad-fuzzy-recall": ("hard-V256", "hard-V512", "hard-L2048"),
    "mad-noisy-recall": ("hard-V272", "hard-V528", "hard-L2048"),
    "mad-selective-copy": ("hard-V256", "hard-V512", "hard-L2048"),
    "mad-compression": ("hard-V256", "hard-V512", "hard-L512", "hard-L1024", "hard-L2048"),
}


def n_train_of(task: str, preset: str) -> int:
    """MAD's training-set size of a preset (tests check it against mixzoo.tasks.mad)."""
    if preset.startswith("n") and preset[1:].isdigit():
        return int(preset[1:])
    return 256 if task == "mad-memorization" else 12_800


def _epochs200(task: str, preset: str) -> dict:
    """MAD's budget: up to 200 epochs at batch 128 (TS:307), as steps, with its early stop."""
    steps = 200 * n_train_of(task, preset) // 128
    return {"steps": steps, "eval_every": max(50, steps // 20)}


def _settings(presets: dict, budget: bool = False, tags=None) -> tuple[dict, ...]:
    out = []
    for task, names in presets.items():
        for p in names:
            s = {"task": task, "preset": p, **(_epochs200(task, p) if budget else {})}
            if tags:
                s["tags"] = tags(p)
            out.append(s)
    return tuple(out)


MAD_STATED = (
    Stated("suite", "MAD's six tasks, its settings and score (per task the mean over its settings, then the mean "
           "over tasks)", "PR:47-57; TS:325-326"),
    Stated("optimizer", "all models trained with Muon", "PR:47"),
    Stated("MAD protocol", "width 128, 2 blocks of mixer + SwiGLU, batch 128, up to 200 epochs, early stop at "
           "accuracy 0.999, grid of 3 learning rates x 2 weight decays, 1,280 test examples", "TS:302-328"),
)
MAD_CHOICES = (
    Choice("width", "128, 16 heads (recipe mad), 2 blocks", "MAD's canonical model (TS:302); not restated by the paper"),
    Choice("steps", "paper: 200 epochs at batch 128 (20,000 steps at 12,800 examples; fewer for the smaller training "
           "sets); small: 600 steps (about 6 epochs)", "MAD's budget (TS:307) at paper scale; small is what fits "
           "half an hour for 8 mechanisms; both early-stop at validation accuracy 0.999 (TS:315)"),
    Choice("lr", "paper: MAD's grid, lr {1e-4, 5e-4, 1e-3} x weight decay {0, 0.1}; small: lr {5e-4, 1e-3} at "
           "weight decay 0", "Muon's learning rate is not stated (PR:66); mixzoo's Muon matches AdamW's update RMS "
           "(README), so MAD's AdamW grid (TS:321) carries over; small keeps the two larger rates (600 steps are too "
           "few for 1e-4) and no weight decay (little for it to act on in 600 steps)"),
    Choice("batch", "128", "MAD's (TS:307)"),
    Choice("schedule", "cosine with 5% warm-up (the trainer's default), Muon momentum 0.95",
           "the paper states Muon only for MAD; its WSD schedule and weight-decay annealing are stated for "
           "pretraining (PR:60-61), so MAD's own cosine schedule (TS:308) is kept"),
    Choice("mechanism knobs", "each constructor's defaults (not MAD's iso-state layer configs)",
           "the paper does not state them; one set of defaults for every task"),
    Choice("selection", "best grid point on the validation split (one search seed), then 3 final seeds on test",
           "MAD selects its checkpoint on test (TS:315-318); mixzoo never selects on test (TS:719)"),
)

_REF_TABLE = {   # PR:51-55: average, in-context recall, selective copy (printed in a table: exact)
    "parallax": (0.716, 0.951, 0.988), "softmax": (0.672, 0.803, 0.950), "gdn": (0.665, 0.920, 0.939),
    "mesa": (0.659, 0.998, 0.568), "mamba": (0.631, 0.756, 0.950),
}
_MAD2024 = {     # PR:72-75, %: Compress, Fuzzy, In-Context, Memorize, Noisy, Sel. Copy, Avg (AdamW, MAD protocol)
    "softmax": (51.6, 29.8, 94.1, 85.2, 86.8, 99.6, 74.5), "hyena": (45.2, 7.9, 81.7, 89.5, 78.8, 93.1, 66.0),
    "mamba": (52.7, 6.7, 90.4, 89.5, 90.1, 86.3, 69.3), "gla": (38.8, 6.9, 80.8, 63.3, 81.6, 88.6, 60.0),
}
_MAD2024_COLS = ("mad-compression", "mad-fuzzy-recall", "mad-recall", "mad-memorization", "mad-noisy-recall",
                 "mad-selective-copy", "average")


def _refs() -> tuple[Ref, ...]:
    out = []
    for m, (avg, rec, sel) in _REF_TABLE.items():
        for name, v in (("average", avg), ("mad-recall", rec), ("mad-selective-copy", sel)):
            out.append(Ref({"aggregate": name}, m, v, "PR:49-55", approx=False))
    for m, vals in _MAD2024.items():
        for name, v in zip(_MAD2024_COLS, vals):
            out.append(Ref({"aggregate": name}, m, round(v / 100, 4), "PR:70-75", approx=False,
                           column="MAD 2024 (AdamW)"))
    return tuple(out)


_SMOKE_TRAIN = {"steps": 6, "batch_size": 4, "eval_every": 3, "n_train": 16, "n_val": 8, "n_test": 8,
                "d_model": 16, "num_heads": 2, "eval_batch_size": 16, "early_stop": None}
_TRAIN = {"optimizer": "muon", "batch_size": 128, "n_layers": 2, "early_stop": 0.999, "n_val": 1280, "n_test": 1280}

MAD = Figure(
    name="parallax-mad", paper=PAPER, figure="MAD table", kind="sweep", task="mad-recall", recipe="mad",
    title="the MAD suite with every model trained with Muon: MAD score per task and on average",
    models=PAPER5, extra_models=("lla", "gla", "hyena"), train=_TRAIN,
    stated=MAD_STATED,
    choices=MAD_CHOICES + (
        Choice("settings at small", "each task's baseline setting (6)", "MAD's 66 settings are paper scale; at "
               "small a task's score is its baseline setting's, so 'average' is the mean of six settings"),),
    reference=_refs(),
    aggregates=tuple(Aggregate(t, where={"task": t}) for t in MAD_TASKS) + (Aggregate("average", of=MAD_TASKS),),
    scales={
        "smoke": Scale(settings=({"task": "mad-recall", "preset": "baseline"},
                                 {"task": "mad-selective-copy", "preset": "baseline"}),
                       models=("parallax", "softmax"), lr=(1e-3,), weight_decay=(0.0,), seeds=2, train=_SMOKE_TRAIN,
                       why="CI plumbing only (seconds on a 2-core CPU): two tasks' baselines, tiny model, 6 steps"),
        "small": Scale(settings=_settings({t: ("baseline",) for t in MAD_TASKS}), lr=(5e-4, 1e-3),
                       weight_decay=(0.0,), train={"steps": 600, "eval_every": 100},
                       why="6 settings x 8 mechanisms x (2 grid points + 3 seeds) x 600 steps (~30 min, estimated)"),
        "paper": Scale(settings=_settings({t: ("baseline",) + _AXES[t] for t in MAD_TASKS}, budget=True),
                       lr=(1e-4, 5e-4, 1e-3), weight_decay=(0.0, 0.1), why="MAD's 66 settings, grid and budget"),
    },
    claims=(
        Claim("mad-parallax-best-average", "Parallax has the highest MAD average (0.716; next softmax 0.672)",
              "PR:49-52", kind="diff", a=("parallax",), b=BASELINES, where={"aggregate": "average"}),
        Claim("mad-mamba-lowest-average", "Mamba has the lowest average of the five (0.631; the others 0.659 to "
              "0.716)", "PR:51-55", kind="diff", a=("parallax", "softmax", "gdn", "mesa"), b=("mamba",),
              where={"aggregate": "average"}),
        Claim("mad-mesa-best-recall", "MesaNet is best at in-context recall (0.998; next Parallax 0.951)", "PR:51-55",
              kind="diff", a=("mesa",), b=("parallax", "softmax", "gdn", "mamba"), where={"aggregate": "mad-recall"}),
        Claim("mad-parallax-best-selcopy", "Parallax is best at selective copying (0.988; next 0.950)", "PR:51-55",
              kind="diff", a=("parallax",), b=BASELINES, where={"aggregate": "mad-selective-copy"}),
        Claim("mad-mesa-selcopy-gap", "MesaNet is far below the others at selective copying (0.568 against >= 0.939; "
              "tested: by more than half that gap, 0.185)", "PR:51-55", kind="diff",
              a=("parallax", "softmax", "gdn", "mamba"), b=("mesa",), threshold=0.185,
              where={"aggregate": "mad-selective-copy"}),
    ),
    notes="The average and the two task columns are the paper's; the other four task columns are not in our notes "
          "(PR:57). MAD 2024 (AdamW) is MAD's own protocol with AdamW (PR:68-78): a few points are this protocol's "
          "reproduction noise (PR:77-78).",
)


def _range(preset: str) -> dict:
    return {"range": "hard" if preset.startswith("hard-") else "base"}


_HARD_TASKS = tuple(_HARD)
_RANGE_AGGS = tuple(Aggregate(t, where={"task": t, "range": r}, tags={"range": r}) for r in ("base", "hard")
                    for t in _HARD_TASKS) + \
    tuple(Aggregate("average", of=_HARD_TASKS, tags={"range": r}) for r in ("base", "hard"))

MAD_HARD = Figure(
    name="parallax-mad-hard", paper=PAPER, figure="MAD, harder range", kind="sweep", task="mad-recall", recipe="mad",
    title="MAD's tasks at vocabulary up to 512 and context up to 2048, beside their baselines, with Muon",
    models=PAPER5, extra_models=("lla", "gla", "hyena"), train=_TRAIN,
    stated=MAD_STATED + (Stated("harder range", "vocabulary up to 512, context up to 2048", "PR:57-58"),),
    choices=MAD_CHOICES + (
        Choice("harder settings", "V 256 and 512 (272 and 528 with noisy recall's 16 noise tokens), L 2048, one axis "
               "at a time from each task's baseline; compression also L 512, 1024; memorization has no such axis",
               "the notes give only the upper ends (PR:57-58); these are mixzoo.tasks.mad's hard presets"),
        Choice("reference level", "each task's MAD baseline setting, run in this spec (range = base)",
               "'the baselines drop' needs a level to drop from, at the same budget"),
        Choice("settings at small", "recall, noisy recall and selective copying: baseline and V 512 (528)",
               "context 2048 costs 16x a baseline step and does not fit half an hour; it is in paper scale"),
    ),
    aggregates=_RANGE_AGGS,
    scales={
        "smoke": Scale(settings=({"task": "mad-recall", "preset": "baseline", "tags": {"range": "base"}},
                                 {"task": "mad-recall", "preset": "hard-V256", "tags": {"range": "hard"}}),
                       models=("parallax", "softmax"), lr=(1e-3,), weight_decay=(0.0,), seeds=2, train=_SMOKE_TRAIN,
                       why="CI plumbing only (seconds on a 2-core CPU): recall at its baseline and V = 256, tiny model"),
        "small": Scale(settings=_settings({"mad-recall": ("baseline", "hard-V512"),
                                           "mad-noisy-recall": ("baseline", "hard-V528"),
                                           "mad-selective-copy": ("baseline", "hard-V512")}, tags=_range),
                       lr=(5e-4, 1e-3), weight_decay=(0.0,), train={"steps": 600, "eval_every": 100},
                       why="6 settings x 8 mechanisms x (2 grid points + 3 seeds) x 600 steps (~30 min, estimated)"),
        "paper": Scale(settings=_settings({t: ("baseline",) + _HARD[t] for t in _HARD_TASKS}, budget=True, tags=_range),
                       lr=(1e-4, 5e-4, 1e-3), weight_decay=(0.0, 0.1),
                       why="every hard setting and each task's baseline, MAD's grid and budget"),
    },
    claims=(
        Claim("hard-parallax-best", "on the harder range Parallax is above the baselines", "PR:57-58", kind="diff",
              a=("parallax",), b=BASELINES, where={"aggregate": "average", "range": "hard"}),
        Claim("hard-parallax-drops-least", "the baselines drop sharply, Parallax largely keeps its accuracy: its lead "
              "grows from the baseline settings to the harder ones", "PR:57-58", kind="diff", a=("parallax",),
              b=BASELINES, where={"aggregate": "average"}, along="range", order=("base", "hard")),
        Claim("hard-baselines-drop", "the baselines drop sharply (tested: by more than 0.10)", "PR:58", kind="value",
              a=BASELINES, test="below", threshold=-0.10, where={"aggregate": "average"}, along="range",
              order=("base", "hard")),
        Claim("hard-parallax-keeps", "Parallax largely keeps its accuracy (tested: loses less than 0.05)", "PR:58",
              kind="value", a=("parallax",), test="above", threshold=-0.05, where={"aggregate": "average"},
              along="range", order=("base", "hard")),
    ),
    notes="The paper's words are the only reference here (no numbers in our notes).",
)

FIGURES = (MAD, MAD_HARD)
