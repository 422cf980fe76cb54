"""Our own kernels, each with a plain-PyTorch reference beside it. Imports nothing of mixzoo.

``RAN`` names the backbone kernels (swiglu, rmsnorm, rope, causal_conv) that ran since the last
``reset()``: the trainer resets it when a run starts and records ``ran()`` in the run's result (the
leaderboard's ``kernels`` column), since they change a run's numbers at the input dtype's rounding.
``eager()`` turns them off for the trainer's eager loop."""

import contextlib
import os

RAN: set[str] = set()
_EAGER = 0
# the switches that pick a kernel by name (the others are on/off); checked once at the command line
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
SSD_FORMS = ("bf16", "ieee")       # the SSD kernels' products (ssd_intra_triton); the first is the default
# steps of fla's chunked GLA (gla_steps): mixzoo's kernel or fla's; the first is the default (each mixzoo's after
# the H200: benchmarks/h200-2026-12-03c, -03d)
GLA_SWITCHES = {"MIXZOO_GLA_DV": ("triton", "fla"), "MIXZOO_GLA_DQKG": ("triton", "fla"), "MIXZOO_GLA_O": ("triton", "fla")}
# softmax attention with heads of at most 16 (attn): mixzoo's Triton kernels or SDPA; the first is the default
# (after the H200: a stacked+graphed softmax step 1.04x, benchmarks/h200-2026-12-03d)
ATTN_CHOICES = ("triton", "sdpa")
# Parallax: fla's kernels at mixzoo's tiles (parallax_tiles) or at fla's; the first is the default (after the H200:
# benchmarks/h200-2026-12-03e)
PARALLAX_TILES = ("mixzoo", "fla")
# Parallax's prologue (parallax_prologue): one Triton kernel each way ("fused", the default: with the unpadded launch,
# Parallax's stacked+graphed K = 6 step 1.16-1.26x on an H100, 2026-12-06, benchmarks/calls-2026-12-06d) or the layer's
# separate rotation and norm kernels, cast and copies ("torch")
PARALLAX_PROLOGUE = ("fused", "torch")
# softmax attention's and LLA's q, k, v (parallax_prologue.qkv_prologue, models.common.qkv_heads): the split views,
# two rotation kernels and backward the concatenation ("torch"), or that kernel without r, one pass each way
# ("fused"). Unset, each mechanism's default: softmax's "torch" (with the prologue its stacked+graphed K = 6 step was
# 0.95-0.99x on an H200, benchmarks/calls-2026-12-06e, and 0.97-0.99x with the aligned strides on an H100,
# benchmarks/calls-2026-12-06f), LLA's "fused" (models.lla.QKV_PROLOGUE_DEFAULT: its strided heads read the prologue's
# output with no copy)
QKV_PROLOGUE = ("torch", "fused")
# LLA's kernels: the heads read where they lie through their strides, at their width padded in registers ("strided",
# the default: from the qkv prologue 1.03-1.07x the padded copies' stacked+graphed K = 6 step at MAD's lengths on an
# H200, 2026-12-06, benchmarks/calls-2026-12-06f), zero-padded contiguous (B·H, T, 16) copies ("padded"), or contiguous
# per head at their width, copied so where they are not ("contiguous", 1.01-1.05x); the same numbers
# (lla.triton_lla.heads_mode)
LLA_HEADS = ("strided", "padded", "contiguous")
# softmax's attention kernels: the heads' strides in units of the rows' alignment ("aligned", the default,
# ``aligned_strides``: a head of 8 then loads as 16-byte vectors through cp.async; softmax's stacked+graphed K = 6
# step 1.08-1.13x at MAD's lengths on an H100, 2026-12-06, benchmarks/calls-2026-12-06f/) or as they are ("plain":
# its rows of 8 then load element by element, benchmarks/ptx_loads.py)
ATTN_STRIDES = ("aligned", "plain")
# Mamba-2's scan at value heads narrower than fla's 64, on a GPU: mamba-ssm's Triton SSD (mamba_chunk_scan_combined)
# where installed and matched on the device, or mixzoo's chunked form (torch-chunk); the first is the default
MAMBA_SSD = ("mamba-ssm", "torch-chunk")
# that SSD under stacking (train.vmapfold.ssd_models_per_call): the K models in as many folded calls as keep torch's
# cumsum in its backward under the rows it scans well ("split"), or in one call ("whole"); the first is the default
MAMBA_SSD_FOLD = ("split", "whole")
# MesaNet's chunk_mesa_net under stacking (train.vmapfold.mesa_models_per_call): one call a model, or the K models in one
# heads fold; the first is the default
MESA_FOLD = ("per-model", "whole")
# an op folded into the heads under stacking (train.vmapfold; mamba-ssm's SSD): its inputs' gradients handed back as
# views of its folded layout, strided per model ("views", the default), or copied once into each input's own layout
# ("contiguous"), so that the split of a projection they come from is undone by a vectorized cat
FOLD_HEADS_GRAD = ("views", "contiguous")
# a stacked run's validations (train.stacked): each model on its own, eagerly, as a separate run validates ("models",
# the default), or the K models in one vmapped forward a batch (``evaluate_stack``; "vmapped"), then each model's
# diagnostics and best weights as before; the same metrics up to float32 reordering. Not yet timed on a GPU
# (benchmarks/validation_time.py)
STACKED_EVAL = ("models", "vmapped")
# the token embedding's weight gradient (embedding): PyTorch's sort-based embedding backward ("sort", the default) or
# one float32 one-hot product for vocabularies up to 256 ("onehot"); the same sums in another order. Not yet timed
EMBED_GRAD = ("sort", "onehot")
# the short convolution under stacking (causal_conv._fold): the models in the batch or in the channels; the first is
# the default
CONV_FOLDS = ("batch", "channels")
# the short convolution's backward (causal_conv_triton.backward): one pass a row at a time or two passes through dz
CONV_BWD = ("seq", "two-pass")
# its forward (causal_conv_triton.forward): a row at a time or in (positions, channels) tiles
CONV_FWD = ("seq", "tiles")
# LLA's explicit solve (lla.triton_lla): the backward takes the forward's C ("forward") or sums it again
LLA_C = ("forward", "summed")
# and its right-hand side h = Σ_VKᵀ g from moments the forward kept ("forward", its output then formed from them) or
# summed again over the keys
LLA_H = ("forward", "summed")
# and its precision level: at most 1 ("capped", the default: 1.02-1.05x LLA's stacked+graphed step on an H100, 2026-12-06,
# and the GPU tests' errors unchanged) or the one λ gives ("level")
LLA_DIRECT_PREC = ("capped", "level")
# the small-head attention's tiles (attn.default_tiles): by length, or the single set used before
ATTN_TILES = ("by-length", "old")
# the width gdn's, GLA's, MesaNet's and Parallax's narrower heads are padded to in memory before fla's kernels
# (models._fla.fla_pad_width; unset, each mechanism's default: MesaNet's and Parallax's none, the others' 16)
FLA_PAD = ("16", "none")
# gdn's and GLA's heads of at most 16 on a GPU: mixzoo's recurrent scans (recurrent) or fla's chunk kernels; the first
# is the default
REC_CORE = ("rec", "fla")
# those scans' tilings (recurrent_triton.TILES): as chosen by benchmarks/recurrent_tiles.py, or the one used before
REC_TILES = ("tuned", "old")
# GLA's five input projections (q, k, v, the output gate, the decay's low-rank input): one matmul over their weights
# concatenated (the default), or five (the form before; the parameters are the same either way)
GLA_PROJ = ("fused", "separate")
# Hyena's FFT step (fftconv): the autograd Function ("fused", the default: timed on an H100, 2026-12-06) or the
# composition autograd differentiates ("torch")
HYENA_CONV = ("fused", "torch")
# Hyena's long convolution by length: Toeplitz products up to models.hyena.DIRECT_MAX_LEN, FFTs beyond ("by-length",
# the default), or FFTs at every length ("fft"), or Toeplitz products at every length ("toeplitz"; their matrices take
# C·T² numbers a model and order): to time the paths against each other
HYENA_PATH = ("by-length", "fft", "toeplitz")
# Hyena's Toeplitz step (fftconv.gated_toeplitz_conv): the composition ("torch", the default until the Function is
# timed on a GPU) or the autograd Function ("fused")
HYENA_TOEPLITZ = ("torch", "fused")
# Hyena's whole operator (fftconv.hyena_operator): as one Function ("fused", the default: 1.05-1.07x the steps' stacked
# training step at lengths 128 to 1024 on an H100, 2026-12-06) or its steps one at a time as above ("steps")
HYENA_OP = ("fused", "steps")
# Hyena's Toeplitz products (fftconv's direct path, up to models.hyena.DIRECT_MAX_LEN, in its Functions: the operator
# and the Toeplitz step) for float32 operands: float32 einsums, CUDA-core FFMA GEMMs on a GPU ("fp32", the default), or
# "bf16x3": each operand split into bfloat16 hi + lo, hi·hi + hi·lo + lo·hi in one bf16 tensor-core GEMM a product,
# float32 accumulation (about 2^-16 relative a product against float32's 2^-24; fftconv._bf16x3_forward): 0.85x the
# stacked+graphed step at 128 on an H100, 2026-12-07c. float64 keeps its einsums
HYENA_TOEPLITZ_MM = ("fp32", "bf16x3")
# that Function's FFT operands: written into zero-padded buffers ("buffers", the default) or padded by rfft ("rfft")
HYENA_FFT_PAD = ("buffers", "rfft")
# that Function's layout: its input transposed once into a contiguous channels-first copy, the output and the input's
# gradient transposed back ("channels", the default) or the products through transposed views ("strided")
HYENA_LAYOUT = ("channels", "strided")
# its FFTs' 1/n: in the filters' spectrum ("filter", the default; exact, a power of two: the same numbers) or a pass over
# each irfft's output ("output", torch's default)
HYENA_FFT_SCALE = ("filter", "output")
# gdn's, GLA's and MesaNet's gated output norm (models._parts.GatedNorm: the norm, then times silu of the gate): one
# kernel each way (rmsnorm.rms_norm_gate, "fused", the default: stacked+graphed K = 6 at MAD's lengths 128 / 256 / 1024
# on an H100, side by side, gdn 1.05 / 1.04 / 1.04x, GLA 1.05 / 1.05x at 128 / 256, MesaNet 1.02 / 1.02 / 1.03x;
# benchmarks/calls-2026-12-07c), or the norm's kernel, then PyTorch's silu, product and cast ("torch"); the same
# numbers up to float32 reordering
GATED_NORM = ("fused", "torch")
NAMED_SWITCHES = {"MIXZOO_SDPA": SDPA_BACKENDS, "MIXZOO_ATTN": ATTN_CHOICES, "MIXZOO_LLA_C": LLA_C,
                  "MIXZOO_LLA_H": LLA_H,
                  "MIXZOO_LLA_DIRECT_PREC": LLA_DIRECT_PREC, "MIXZOO_PARALLAX_TILES": PARALLAX_TILES,
                  "MIXZOO_PARALLAX_PROLOGUE": PARALLAX_PROLOGUE, "MIXZOO_QKV_PROLOGUE": QKV_PROLOGUE,
                  "MIXZOO_LLA_HEADS": LLA_HEADS, "MIXZOO_ATTN_STRIDES": ATTN_STRIDES, "MIXZOO_SSD_DOT": SSD_FORMS,
                  "MIXZOO_MAMBA_SSD": MAMBA_SSD, "MIXZOO_MAMBA_SSD_FOLD": MAMBA_SSD_FOLD, "MIXZOO_MESA_FOLD": MESA_FOLD,
                  "MIXZOO_FOLD_HEADS_GRAD": FOLD_HEADS_GRAD, "MIXZOO_STACKED_EVAL": STACKED_EVAL,
                  "MIXZOO_EMBED_GRAD": EMBED_GRAD,
                  "MIXZOO_CONV_FOLD": CONV_FOLDS, "MIXZOO_CONV_BWD": CONV_BWD, "MIXZOO_CONV_FWD": CONV_FWD,
                  "MIXZOO_ATTN_TILES": ATTN_TILES, "MIXZOO_FLA_PAD": FLA_PAD, "MIXZOO_GDN": REC_CORE, "MIXZOO_GLA_CORE": REC_CORE,
                  "MIXZOO_REC_TILES": REC_TILES, "MIXZOO_GLA_PROJ": GLA_PROJ, "MIXZOO_HYENA_CONV": HYENA_CONV,
                  "MIXZOO_HYENA_PATH": HYENA_PATH, "MIXZOO_HYENA_TOEPLITZ": HYENA_TOEPLITZ,
                  "MIXZOO_HYENA_OP": HYENA_OP, "MIXZOO_HYENA_FFT_PAD": HYENA_FFT_PAD,
                  "MIXZOO_HYENA_LAYOUT": HYENA_LAYOUT, "MIXZOO_HYENA_FFT_SCALE": HYENA_FFT_SCALE,
                  "MIXZOO_HYENA_TOEPLITZ_MM": HYENA_TOEPLITZ_MM,
                  "MIXZOO_GATED_NORM": GATED_NORM, **GLA_SWITCHES}


def padded_dim(D: int) -> int:
    """The width a kernel's tiles give a head of D dims: the next power of two, at least 16 (``tl.dot``'s least K)."""
    return max(16, 1 << (D - 1).bit_length())


def aligned_strides(strides) -> tuple[int, list[int]]:
    """(VEC, the strides in units of VEC): VEC the largest power of two up to 16 dividing every stride. A kernel that
    multiplies them back by VEC as a constexpr knows each row it reads starts VEC-aligned: Triton's launcher marks
    integers divisible by 16 only, so a stride of 8 passed as it is leaves a head of 8 bf16 values read element by
    element, without cp.async (benchmarks/ptx_loads.py; LLA's step at length 1024 0.84-0.89x, 2026-12-06)."""
    vec = 16
    while vec > 1 and any(s % vec for s in strides):
        vec //= 2
    return vec, [s // vec for s in strides]


def chosen(var: str) -> str:
    """The value of the named switch ``var`` (``NAMED_SWITCHES``): the environment's, or its first, the default."""
    return os.environ.get(var) or NAMED_SWITCHES[var][0]


def switch_error() -> str | None:
    """What is wrong with the named switches in the environment (one line), or None."""
    for var, allowed in NAMED_SWITCHES.items():
        v = os.environ.get(var, "")
        if v and v not in allowed:
            return f"{var}={v!r}; allowed: {', '.join(allowed)} (or unset)"
    return None


@contextlib.contextmanager
def eager():
    """Within the block (the trainer's eager loop), the backbone kernels are off unless
    ``MIXZOO_EAGER_KERNELS=1``: an eager step is bound by the host's launches, and a Triton launch costs
    the host more than the PyTorch forms' launches. Graphed steps (launches captured once) and stacked
    ones (one launch for K models) run them."""
    global _EAGER
    _EAGER += 1
    try:
        yield
    finally:
        _EAGER -= 1


def enabled() -> bool:
    """Whether the backbone kernels may run here (each also checks its own switch and device)."""
    return _EAGER == 0 or os.environ.get("MIXZOO_EAGER_KERNELS") == "1"


def reset() -> None:
    RAN.clear()


def ran() -> str | None:
    """The kernels that ran, comma-separated and sorted, or None."""
    return ",".join(sorted(RAN)) or None
