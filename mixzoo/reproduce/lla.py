"""The LLA paper's synthetic figures (Zuo et al., "Local Linear Attention", ICLR 2026).

Sources, cited as file:line: ``PR`` = ../shared/reference/paper_results.md (what the paper
states and reports, from reading notes: numbers read off figures are approximate), ``TS`` =
../shared/reference/task_specs.md (the public harnesses the tasks come from). Where the paper is
silent the value is a :class:`Choice` with its reason, fixed before any run.
"""
from __future__ import annotations

from .spec import Aggregate, Choice, Claim, Figure, Ref, Scale, Stated  # noqa: F401  (Aggregate: none here)

PAPER = "LLA paper (Zuo et al., ICLR 2026)"

# zoology's learning-rate grid, logspace(-4, -2, 4): the only grid stated in the harnesses these tasks
# come from (TS:130); one grid for every trained LLA figure, so no figure gets a grid of its own
ZOOLOGY_LR = (1e-4, 4.64e-4, 2.15e-3, 1e-2)
# at small scale (1000-5000 steps) 1e-4 barely moves a model from its initialization: dropped
SMALL_LR = (4.64e-4, 2.15e-3, 1e-2)
ARCH = {"d_model": 128, "num_heads": 2, "n_layers": 2}     # PR:22-23 (Fig. 5(a)'s model, no MLP)
NO_SHORT_CONV = {"gdn": {"conv_size": 1}, "mamba": {"conv_size": 1}, "mesa": {"conv_size": 1},
                 "hyena": {"short_conv": 1}}

ARCH_STATED = Stated("model", "width 128, 2 heads, 2 layers, no MLP (recipe zoology)", "PR:22-23")
SMOKE_TRAIN = {"steps": 6, "batch_size": 4, "eval_every": 3, "n_train": 16, "n_val": 8, "n_test": 8,
               "d_model": 8, "num_heads": 2, "eval_batch_size": 16}
SMOKE_WHY = "CI plumbing only (seconds on a 2-core CPU): tiny model, 6 steps, one learning rate, 2 seeds"
TTR_SMOKE_WHY = "CI plumbing only (seconds on a 2-core CPU): L = 64, 4 test sequences, 2 seeds"

# ---------------------------------------------------------------------------- Fig. 3 / Fig. 4
TTR_CHOICES = (
    Choice("sequences", "small: 2,000 test sequences per (setting, seed); paper: 10,000 (PR:13)",
           "the paper averages 10,000 sequences; small takes a fifth of that per seed and 3 seeds"),
    Choice("grids", "each core's registry grid (lla ridge x scale 5x3, mesa ridge x decay 5x3, softmax scale 7, "
           "linear scale 7, gdn beta x decay 4x4), tuned per (setting, seed) on 16 (small) / 64 (paper) sequences "
           "of the validation stream", "the bandwidth/ridge grids are not stated (PR:19); the registry's grids are "
           "mixzoo ttr's, fixed before any run"),
    Choice("cone width and noise", "cone_width 0.15, noise 0.1 (the ttr task's defaults)",
           "not stated (PR:18-19); our generator is a reconstruction (TS section 5)"),
    Choice("seeds", "3 seeds, each with its own tuning and test sequences",
           "the paper reports one average; seeds give the intervals the verdicts need"),
    Choice("estimators beside the paper's", "gdn's delta-rule core and a zero predictor",
           "cheap and informative; in no claim. parallax, mamba, gla and hyena have no functional core"),
)

FIG3 = Figure(
    name="lla-fig3", paper=PAPER, figure="Fig. 3", kind="ttr", task="ttr",
    title="piecewise test-time regression: per-position error around segment switches (training-free)",
    models=("lla", "mesa", "softmax", "linear", "random"),          # PR:12-13
    extra_models=("gdn", "zero"),
    knobs={"d": 64, "L": 1024},                                       # PR:14 (Fig. 3 panels)
    stated=(Stated("task", "L = 1024 pairs in segments of S, keys from one cone per segment, v = A_c k + eps",
                   "PR:10-12"),
            Stated("panels", "d = 64, L = 1024", "PR:14"),
            Stated("estimators", "LLA, softmax, MesaNet, linear attention, a random predictor", "PR:12-13"),
            Stated("averaging", "10,000 independent sequences", "PR:13"),
            Stated("metric", "MSE per position (plotted as loss / dim)", "PR:14")),
    choices=TTR_CHOICES + (
        Choice("S values", "8 .. 1024 in powers of 2 (small and paper)",
               "the panels' S are not in the notes; the stated range is 8 to 1024 (PR:11); S = 1024 is the "
               "unchanged sequence where MesaNet's global fit should win. Small differs from paper only in "
               "the number of sequences (the figure is cheap: --list)"),),
    scales={
        "smoke": Scale(settings=({"L": 64, "d": 8, "S": 16}, {"L": 64, "d": 8, "S": 64}),
                       models=("lla", "mesa", "softmax", "linear", "random"), seeds=2, sequences=4,
                       tune_sequences=2, why=TTR_SMOKE_WHY),
        "small": Scale(settings=tuple({"S": s} for s in (8, 16, 32, 64, 128, 256, 512, 1024)), seeds=3,
                       sequences=2000, tune_sequences=16, why="the stated range, 2,000 sequences a seed"),
        "paper": Scale(settings=tuple({"S": s} for s in (8, 16, 32, 64, 128, 256, 512, 1024)), seeds=3,
                       sequences=10_000, tune_sequences=64, why="the stated range and averaging (PR:11, PR:13)"),
    },
    claims=(
        Claim("fig3-lla-lowest-after-switch", "LLA has the lowest error after the segment switches", "PR:15",
              kind="diff", a=("lla",), b=("mesa", "softmax", "linear", "random"), metric="mse_after_switch"),
        Claim("fig3-mesa-first-segment", "MesaNet can beat LLA on the first (unchanged) segment", "PR:15-16",
              kind="diff", a=("mesa",), b=("lla",), metric="mse_first_segment", quantifier="some"),
        Claim("fig3-mesa-mismatch-after-switch", "then its (MesaNet's) global map mismatches after a switch",
              "PR:16", kind="diff", a=("lla",), b=("mesa",), metric="mse_after_switch"),
        Claim("fig3-crossover", "MesaNet ahead of LLA before the first switch, behind it after", "PR:15-16",
              kind="all", of=("fig3-mesa-first-segment", "fig3-mesa-mismatch-after-switch")),
        Claim("fig3-softmax-precision-gap", "softmax tracks locally but keeps a precision gap (to LLA)", "PR:16-17",
              kind="diff", a=("lla",), b=("softmax",)),
    ),
)

FIG4 = Figure(
    name="lla-fig4", paper=PAPER, figure="Fig. 4", kind="ttr", task="ttr",
    title="test-time regression: total MSE of each estimator over LLA's, against the dimension d (training-free)",
    models=("lla", "mesa", "softmax", "linear"),                      # PR:12-13, PR:17
    extra_models=("gdn", "random"),
    knobs={"L": 1024},
    stated=(Stated("task", "L = 1024, d from 8 to 128, S from 8 to 1024", "PR:10-11"),
            Stated("plotted", "total-MSE(model) / total-MSE(LLA) against d", "PR:17"),
            Stated("averaging", "10,000 independent sequences", "PR:13")),
    choices=TTR_CHOICES + (
        Choice("d and S values", "d 8, 16, 32, 64, 128 x S 16, 64, 256, 1024 (small and paper)",
               "the stated ranges (PR:10-11); the figure's S values are not in the notes, so S spans the range in "
               "factors of 4, and includes 1024, the long-segment end of the claim PR:18. Small differs from paper "
               "only in the number of sequences"),),
    scales={
        "smoke": Scale(settings=({"L": 64, "d": 4, "S": 16}, {"L": 64, "d": 16, "S": 16}),
                       models=("lla", "mesa", "softmax"), seeds=2, sequences=4, tune_sequences=2,
                       why=TTR_SMOKE_WHY),
        "small": Scale(settings=tuple({"d": d, "S": s} for s in (16, 64, 256, 1024) for d in (8, 16, 32, 64, 128)),
                       seeds=3, sequences=2000, tune_sequences=16, why="the stated ranges, 2,000 sequences a seed"),
        "paper": Scale(settings=tuple({"d": d, "S": s} for s in (16, 64, 256, 1024) for d in (8, 16, 32, 64, 128)),
                       seeds=3, sequences=10_000, tune_sequences=64, why="the stated ranges and averaging"),
    },
    claims=(
        Claim("fig4-ratio-rises-with-d", "total-MSE(model) / total-MSE(LLA) rises with d overall", "PR:17-18",
              kind="ratio", a=("mesa", "softmax", "linear"), b=("lla",), along="d", test="above", threshold=0.0),
        Claim("fig4-mesa-below-one", "some low-d, long-segment MesaNet points are below 1", "PR:18",
              kind="ratio", a=("mesa",), b=("lla",), test="below", threshold=1.0, quantifier="some",
              where={"d": [8, 16], "S": [256, 512, 1024]}),
        Claim("fig4-crossover", "MesaNet's ratio is below 1 at some low d and long segment, and rises with d",
              "PR:17-18", kind="all", of=("fig4-mesa-below-one", "fig4-ratio-rises-with-d")),
    ),
)

# ---------------------------------------------------------------------------- Fig. 5(a)
FIG5A = Figure(
    name="lla-fig5a", paper=PAPER, figure="Fig. 5(a)", kind="sweep", task="icl-regression",
    title="in-context piecewise linear regression (trained), test MSE on the 16 queries",
    models=("lla", "softmax", "mamba", "gla", "hyena", "gdn"),        # PR:23
    extra_models=("parallax", "mesa"),
    knobs={"d_x": 32, "d_y": 32, "n_queries": 16, "noise": 0.1},      # PR:22, PR:24-25
    train={**ARCH, "n_val": 1000, "n_test": 1000, "batch_size": 64},
    stated=(Stated("task", "L shuffled (x, y) pairs from segments of S, then 16 queries; d_x = d_y = 32", "PR:21-22"),
            ARCH_STATED,
            Stated("mechanisms", "LLA; softmax, Mamba, GLA, Hyena, Gated DeltaNet", "PR:23"),
            Stated("settings", "L = 64, 128, 256 and several S", "PR:24"),
            Stated("data", "100k training and 1k test sequences per seed; training noise 0.1, test noiseless", "PR:24-25"),
            Stated("optimizer", "AdamW, up to 100 epochs", "PR:25"),
            Stated("reporting", "best over training hyperparameters, mean of 3 seeds", "PR:25-26")),
    choices=(
        Choice("width", "128, 2 heads, 2 layers, no MLP", "stated for this figure (PR:22-23); listed for the check"),
        Choice("steps", "small: 1,500 (about 5 epochs of 20k sequences); paper: 156,250 (100 epochs of 100k at batch 64)",
               "the paper states up to 100 epochs (PR:25); small is what fits about half an hour for 8 mechanisms"),
        Choice("lr", f"grid {ZOOLOGY_LR} (small and paper), weight decay 0.1, cosine schedule, 5% warm-up",
               "not stated (PR:28); zoology's grid (TS:130) and weight decay (TS:131), the one grid used for every "
               "trained LLA figure; the schedule is the trainer's default"),
        Choice("batch", "64", "not stated; mixzoo's icl-regression default, the same at every scale"),
        Choice("selection", "best grid point on the mean validation MSE of one search seed, then 3 final seeds",
               "the selection split is not stated; mixzoo never selects on test (TS:719)"),
        Choice("token format and cone width", "one [x; y] token per pair, queries [x'; 0]; cone width 0.15; "
               "training queries noisy", "not stated (PR:28); the task's defaults (our reconstruction, TS section 3.1)"),
        Choice("training set at small", "20,000 sequences", "generating 100k takes 20 s and 10.5 GB per run on the "
               "H200 (README); paper scale uses the stated 100k"),
        Choice("S values", "small: L = 256 with S = 16, 64; paper: L = 64, 128, 256 x S = 4, 16, 64",
               "the S values are not stated (PR:24); S = 64 is the headline setting (PR:26), and two S at one L "
               "are the least that checks 'gaps shrink as S grows'"),
    ),
    reference=(Ref({"L": 256, "S": 64}, "lla", 0.07, "PR:26"), Ref({"L": 256, "S": 64}, "softmax", 0.52, "PR:26"),
               Ref({"L": 256, "S": 64}, "gdn", 0.48, "PR:26-27")),
    scales={
        "smoke": Scale(settings=({"L": 8, "S": 2, "d_x": 4, "d_y": 4, "n_queries": 4},
                                 {"L": 8, "S": 8, "d_x": 4, "d_y": 4, "n_queries": 4}),
                       models=("lla", "softmax"), lr=(1e-3,), seeds=2, train=SMOKE_TRAIN, why=SMOKE_WHY),
        "small": Scale(settings=({"L": 256, "S": 16}, {"L": 256, "S": 64}), lr=ZOOLOGY_LR,
                       train={"steps": 1500, "eval_every": 250, "n_train": 20_000},
                       why="2 settings x 8 mechanisms x (4 grid points + 3 seeds) x 1,500 steps (~30 min, estimated)"),
        "paper": Scale(settings=tuple({"L": L, "S": S} for L in (64, 128, 256) for S in (4, 16, 64)), lr=ZOOLOGY_LR,
                       train={"steps": 156_250, "eval_every": 5000, "n_train": 100_000},
                       why="the stated data and epochs; 9 settings"),
    },
    claims=(
        Claim("fig5a-lla-lowest", "LLA lowest at every plotted setting", "PR:27", kind="diff", a=("lla",),
              b=("softmax", "mamba", "gla", "hyena", "gdn")),
        Claim("fig5a-gap-256-64", "at L = 256, S = 64 LLA's MSE is far below softmax's and GDN's (0.07 against 0.52 "
              "and 0.48, read off; tested: less than half)", "PR:26-27", kind="ratio", a=("lla",), b=("softmax", "gdn"),
              test="below", threshold=0.5, where={"L": 256, "S": 64}),
        Claim("fig5a-gaps-shrink-with-S", "gaps shrink as S grows", "PR:27", kind="diff", a=("lla",),
              b=("softmax", "mamba", "gla", "hyena", "gdn"), along="S", test="below", threshold=0.0),
    ),
)

# ---------------------------------------------------------------------------- Fig. 5(b)
_MQAR = [(64, 4), (64, 8), (64, 16), (128, 8), (128, 16), (128, 32), (256, 16), (256, 32), (256, 64),
         (512, 32), (512, 64), (512, 128)]                              # PR:30-32: L/16, L/8, L/4
_BATCH = {64: 512, 128: 512, 256: 256, 512: 128}                         # TS:120
_EPOCH64 = {L: 64 * 100_000 // b for L, b in _BATCH.items()}            # TS:130: 64 epochs of 100k

FIG5B = Figure(
    name="lla-fig5b", paper=PAPER, figure="Fig. 5(b)", kind="sweep", task="mqar",
    title="multi-query associative recall, short convolutions off, test accuracy",
    models=("lla", "softmax", "gdn", "mamba"),                          # the ones PR:32-35 names
    extra_models=("parallax", "mesa", "gla", "hyena"),
    knobs={"V": 8192, "filler": "zero"},                                  # PR:30; TS:119
    train={**ARCH, "n_train": 100_000, "n_val": 1000, "n_test": 3000, "early_stop": 0.99},
    mixer_knobs=NO_SHORT_CONV,
    stated=(Stated("task", "vocabulary 8,192; L 64 to 512; kv = L/16, L/8, L/4; x-axis 512-128 down to 64-4", "PR:30-32"),
            Stated("models", "short convolutions and feature maps disabled for all models", "PR:31"),
            Stated("mechanisms", "the notes name LLA, softmax, Gated DeltaNet and Mamba in this figure", "PR:32-35")),
    choices=(
        Choice("width", "128, 2 heads, 2 layers, no MLP", "not stated (PR:36); Fig. 5(a)'s model (PR:22-23), the one "
               "the paper states for a trained synthetic task, over zoology's per-width curves"),
        Choice("short convolutions off", "recipe zoology (no Based conv layer); gdn, mamba, mesa conv_size = 1, hyena "
               "short_conv = 1 (a one-tap convolution mixes no positions)", "stated (PR:31); a width-1 kernel is how "
               "these constructors turn the convolution off. No mechanism here has a feature map to disable"),
        Choice("steps", "small: 1,000; paper: 64 epochs of 100k (12,500 / 25,000 / 50,000 steps by L)",
               "not stated (PR:36); zoology's 64 epochs (TS:130) at paper scale; small is what fits half an hour"),
        Choice("lr", f"paper {ZOOLOGY_LR}; small {SMALL_LR}; weight decay 0.1", "not stated (PR:36); zoology's grid "
               "and weight decay (TS:130-131); at small 1e-4 is dropped (1,000 steps are too few for it to move)"),
        Choice("batch", "by length as zoology: 512 (L <= 128), 256 (L = 256), 128 (L = 512)", "not stated; TS:120"),
        Choice("data", "100k training, 1k validation, 3k test examples; filler 0 (no random non-query tokens)",
               "zoology's Figure 2 (TS:116, TS:119)"),
        Choice("early stop", "at validation accuracy 0.99", "zoology's threshold (TS:98), on validation, not test"),
        Choice("settings at small", "64-16 and 512-32", "the headline 512-32 (PR:32) and the hardest short setting "
               "(kv = L/4 at L = 64) for the short-setting claims (PR:33-35); 2 settings fit half an hour"),
    ),
    reference=(Ref({"L": 512, "kv": 32}, "lla", 0.43, "PR:32"), Ref({"L": 512, "kv": 32}, "softmax", 0.11, "PR:32")),
    scales={
        "smoke": Scale(settings=({"L": 16, "kv": 2, "V": 32},), models=("lla", "softmax"), lr=(1e-3,), seeds=2,
                       train={**SMOKE_TRAIN, "early_stop": None}, why=SMOKE_WHY),
        "small": Scale(settings=({"L": 64, "kv": 16, "batch_size": 512}, {"L": 512, "kv": 32, "batch_size": 128}),
                       lr=SMALL_LR, train={"steps": 1000, "eval_every": 100},
                       why="2 settings x 8 mechanisms x (3 grid points + 3 seeds) x 1,000 steps (~30 min, estimated)"),
        "paper": Scale(settings=tuple({"L": L, "kv": kv, "batch_size": _BATCH[L], "steps": _EPOCH64[L],
                                       "eval_every": _EPOCH64[L] // 10} for L, kv in _MQAR), lr=ZOOLOGY_LR,
                       why="the 12 stated settings, zoology's 64 epochs and batches"),
    },
    claims=(
        Claim("fig5b-lla-over-softmax-512-32", "at 512-32 LLA is above softmax (≈ 43% against ≈ 11%)", "PR:32",
              kind="diff", a=("lla",), b=("softmax",), where={"L": 512, "kv": 32}),
        Claim("fig5b-gap-512-32", "the 512-32 gap is large (32 points read off; tested: more than half, 16)", "PR:32",
              kind="diff", a=("lla",), b=("softmax",), threshold=0.16, where={"L": 512, "kv": 32}),
        Claim("fig5b-long-hard", "on long, hard settings LLA is clearly above softmax", "PR:32-33", kind="diff",
              a=("lla",), b=("softmax",), where={"L": 512}),
        Claim("fig5b-gdn-near-lla-short", "on some short settings Gated DeltaNet is near or above LLA (tested: not "
              "below it by more than 0.05)", "PR:33-34", kind="diff", a=("gdn",), b=("lla",), threshold=-0.05,
              where={"L": [64, 128]}, quantifier="some"),
        Claim("fig5b-softmax-below-recurrent-short", "softmax well below GDN and Mamba below length 256 (a reviewer's "
              "reading of the figure)", "PR:34-35", kind="diff", a=("gdn", "mamba"), b=("softmax",),
              where={"L": [64, 128]}),
    ),
)

# ---------------------------------------------------------------------------- Fig. 6
FIG6 = Figure(
    name="lla-fig6", paper=PAPER, figure="Fig. 6", kind="sweep", task="state-tracking",
    title="permutation (swap) state tracking, exact-match accuracy of the queried item",
    models=("lla", "softmax", "gdn"),                                   # PR:39-40
    extra_models=("parallax", "mesa", "mamba", "gla", "hyena"),
    knobs={"initial": "random"},                                          # PR:38: an explicit map
    train={**ARCH, "n_train": 100_000, "n_val": 1000, "n_test": 2000, "batch_size": 64},
    stated=(Stated("task", "an explicit position-to-item map, S ~ U(N/6, N/3) swaps, query the final item at a "
                   "position", "PR:38-39"),
            Stated("sizes", "figure: first x-point N = 12; appendix test sizes N in {16, 24, 48, 96}", "PR:41-42"),
            Stated("mechanisms", "the notes name LLA, softmax and Gated DeltaNet", "PR:39-40")),
    choices=(
        Choice("width", "128, 2 heads, 2 layers, no MLP", "model size not stated (PR:42-43); Fig. 5(a)'s model "
               "(PR:22-23), the one the paper states for a trained synthetic task"),
        Choice("steps", "small: 5,000; paper: 20,000", "not stated (PR:43); a probe on the H200 stayed at chance at "
               "N >= 24 within 10k steps, so paper scale doubles that; small is what fits half an hour"),
        Choice("lr", f"paper {ZOOLOGY_LR}; small (4.64e-4, 2.15e-3); weight decay 0.1",
               "not stated; zoology's grid, the one used for every trained LLA figure; small keeps its two inner "
               "points (5,000-step runs of 8 mechanisms at 2 settings fit half an hour with two)"),
        Choice("batch", "64", "not stated; the same at every scale"),
        Choice("data", "100k training, 1k validation, 2k test sequences", "not stated; Fig. 5(a)'s training-set size"),
        Choice("token format", "items, SEP, (SWAP a b) x S, QUERY q; left-padded; one label at the end",
               "not stated (PR:43); our reconstruction (TS section 4.1)"),
        Choice("negative eigenvalues", "off (gdn and mamba at their defaults)", "the paper names Gated DeltaNet, not "
               "its [-1, 1] extension (Grazzi et al., TS section 4.3), which is a separate variant to run apart"),
        Choice("settings", "small: N = 12, 48; paper: N = 12, 16, 24, 48, 96", "both statements of PR:41-42; small "
               "takes the figure's first point and N = 48, where the paper reports values"),
    ),
    reference=(Ref({"N": 48}, "lla", 0.52, "PR:39"), Ref({"N": 48}, "softmax", 0.52, "PR:39-40"),
               Ref({"N": 48}, "gdn", 0.98, "PR:40"), Ref({"N": 96}, "lla", 0.61, "PR:40"),
               Ref({"N": 96}, "gdn", 0.75, "PR:40")),
    scales={
        "smoke": Scale(settings=({"N": 4},), models=("lla", "softmax", "gdn"), lr=(1e-3,), seeds=2,
                       train=SMOKE_TRAIN, why=SMOKE_WHY),
        "small": Scale(settings=({"N": 12}, {"N": 48}), lr=(4.64e-4, 2.15e-3),
                       train={"steps": 5000, "eval_every": 500},
                       why="2 settings x 8 mechanisms x (2 grid points + 3 seeds) x 5,000 steps (~30 min, estimated)"),
        "paper": Scale(settings=tuple({"N": n} for n in (12, 16, 24, 48, 96)), lr=ZOOLOGY_LR,
                       train={"steps": 20_000, "eval_every": 1000}, why="every stated size"),
    },
    claims=(
        Claim("fig6-gdn-best-48", "at N = 48 Gated DeltaNet is far above LLA and softmax (≈ 98% against ≈ 52%)",
              "PR:39-40", kind="diff", a=("gdn",), b=("lla", "softmax"), where={"N": 48}),
        Claim("fig6-gap-48", "the N = 48 gap is large (46 points read off; tested: more than half, 23)", "PR:39-40",
              kind="diff", a=("gdn",), b=("lla",), threshold=0.23, where={"N": 48}),
        Claim("fig6-gdn-over-lla-96", "at N = 96 Gated DeltaNet is above LLA (≈ 75% against ≈ 61%)", "PR:40",
              kind="diff", a=("gdn",), b=("lla",), where={"N": 96}),
        Claim("fig6-lla-softmax-close", "LLA and softmax are close throughout (tested: within 0.05)", "PR:40",
              kind="diff", a=("lla",), b=("softmax",), test="within", threshold=0.05),
    ),
)

FIGURES = (FIG3, FIG4, FIG5A, FIG5B, FIG6)
