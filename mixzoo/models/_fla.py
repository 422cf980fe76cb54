"""Lazy access to flash-linear-attention (fla): its plain-PyTorch references and its Triton ops.

Importing any ``fla.*`` module runs ``fla/__init__``, which imports every layer and model
(seconds). The references are plain torch files, so they are loaded by path instead, without
running the package's ``__init__``. The Triton ops are imported only on a CUDA device, on the
first forward that wants them. Nothing here runs at ``import mixzoo``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path


@functools.cache
def fla_dir() -> Path | None:
    """The fla package folder, found without importing the package."""
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _naive_module(op: str):
    root = fla_dir()
    if root is None:
        return None
    path = root / "ops" / op / "naive.py"
    if not path.is_file():
        return None
    name = f"mixzoo_fla_naive_{op}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception:
        return None
    sys.modules[name] = mod
    return mod


def naive(op: str, fn: str):
    """fla's plain-PyTorch reference ``fla/ops/<op>/naive.py:<fn>``, or None if fla is absent."""
    mod = _naive_module(op)
    return getattr(mod, fn, None) if mod is not None else None


@functools.cache
def _op(module: str, fn: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(module)
        return getattr(mod, fn)
    except Exception:
        return None


# fla's Triton kernels need every dot dimension to be at least 16 (``tl.dot`` K >= 16); the mad
# recipe's 16 heads of width 8 (and GLA's keys of width 4 there) are below that.
MIN_DOT = 16


def fla_pad_width(default: str = "16") -> int:
    """The width a mechanism's narrower heads are zero-padded to before fla's calls: ``MIN_DOT``, or 0 (handed to
    fla as they are). ``MIXZOO_FLA_PAD`` (``16`` or ``none``) sets it for every mechanism; unset, each caller's
    ``default``. Most of fla's kernels (and mixzoo's dqkwg and GLA kernels) take a head of width K in blocks of
    max(16, next power of two of K) with masked loads, i.e. they pad in registers, and padding in memory costs
    copies both ways. MesaNet's default for heads narrower than 16 is ``none``: at the mad recipe's heads of 8
    its layer gave the padded call's output and gradients bit for bit in 0.90x its forward+backward time on an
    H100 (2026-12-06, benchmarks/fla_unpadded.py; benchmarks/h100-2026-12-06/). Parallax's, on mixzoo's launch of
    fla's kernels (``mixzoo.kernels.parallax_tiles``, which sets their block of head columns to at least 16), is
    ``none`` (``models.parallax.PARALLAX_PAD``; bit for bit the padded launch on an H100, 2026-12-06); fla's own
    launcher sets that block to the head's width and needs 16. gdn's and GLA's fla paths (not
    their default at heads of 8, which is mixzoo's recurrent scan) keep ``16`` until they are measured so. A
    row's backend ends in ``+unpadded`` where a head goes unpadded."""
    return 0 if (os.environ.get("MIXZOO_FLA_PAD") or default) == "none" else MIN_DOT


def unpadded_suffix(width: int, default: str = "16") -> str:
    """``+unpadded`` where a head of ``width`` goes to fla as it is (``fla_pad_width(default)`` is 0)."""
    return "+unpadded" if width < MIN_DOT and fla_pad_width(default) == 0 else ""


def pad_heads(*ts, width: int = MIN_DOT):
    """Zero-pad the last (head) dimension of each tensor to at least ``width`` (default ``MIN_DOT``),
    returned contiguous (fla's kernels take contiguous inputs): one copy of a strided view either
    way, so callers need not make views contiguous first.

    Exact for the fla ops mixzoo calls: a zero query/key/probe dimension adds nothing to any dot
    product (q.k, r.k, k kᵀ), and L2 norms are unchanged; a zero value dimension gives zero output
    columns, which the caller slices off (``[..., :d]`` with d the width before padding). Scales must
    be computed from the width before padding and passed explicitly. Log-decays padded with zero
    (decay 1) act on state columns whose keys are zero, so they stay zero."""
    import torch.nn.functional as F
    out = tuple((t if t.shape[-1] >= width else F.pad(t, (0, width - t.shape[-1]))).contiguous() for t in ts)
    return out if len(out) > 1 else out[0]


def triton_op(module: str, fn: str):
    """An fla Triton entry point (e.g. ``("fla.ops.gla", "chunk_gla")``), or None where fla or
    a GPU Triton is unavailable. Call only for CUDA inputs."""
    import torch
    if not torch.cuda.is_available():
        return None
    return _op(module, fn)


def gated_chunk_op(module: str, fn: str, K: int = 16, V: int = 16):
    """fla's gated chunk entry point (used by chunk_gated_delta_rule and chunk_simple_gla) and a
    backend-name suffix: ``(op, "")`` where its backward runs as fla ships it; on Hopper with
    3.4 <= Triton < 3.7.1, where fla refuses its ``chunk_bwd_dqkwg`` kernel and mixzoo's
    replacement (``mixzoo.kernels.fla_dqkwg``) is installed, ``(op, "+triton-dqkwg")`` where
    mixzoo's one-launch Triton version of it runs for key and value heads of K and V (fla's chunk
    of 64) and ``(op, "+torch-dqkwg")`` where its PyTorch version does; else ``(None, "")``. Call
    only for CUDA inputs."""
    op = triton_op(module, fn)
    if op is None:
        return None, ""
    from ..kernels.fla_dqkwg import install, triton_ok, triton_refused
    if not triton_refused():
        return op, ""
    if not install():
        return None, ""
    return op, "+triton-dqkwg" if triton_ok(K, V, 64) else "+torch-dqkwg"



def gla_suffix(K: int, V: int, device) -> str:
    """The backend-name suffix for GLA's fla path with heads of K, V on ``device``: which steps of fla's backward
    run as mixzoo's kernels (``mixzoo.kernels.gla_steps.suffix``: ``+triton-dv`` and the like), else ``""``. Call
    only for CUDA inputs."""
    from ..kernels import gla_steps
    return gla_steps.suffix(K, V, device.index or 0)
