"""What mixzoo's kernels share: whether Triton's interpreter is on (the CPU tests run the kernels in
it), and the self-check that enables a kernel where it has matched its PyTorch reference."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class DeviceCheck:
    """``check(key)``: whether a kernel gives its PyTorch reference's numbers at ``key`` (a device
    index, -1 for the interpreter on the CPU, or a tuple with sizes), asked once per key and
    remembered; an exception is a no.

    It is asked for from a layer's forward, which stacked training runs under ``torch.func.vmap``, so
    it runs with functorch's transforms off (under vmap its random inputs were refused and the check
    of the dqkwg kernel answered False for the rest of the process). Inside a CUDA graph capture it
    cannot run (it reads the device): the answer there is False for that call only, not remembered."""

    def __init__(self, check: Callable[[Hashable], bool]):
        self._check = check
        self.answers: dict[Hashable, bool] = {}

    def __call__(self, key: Hashable) -> bool:
        if key in self.answers:
            return self.answers[key]
        if not interpreting() and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return False
        try:
            off = torch._C._DisableFuncTorch()
        except AttributeError:                      # a torch without the guard: the check as it is
            off = contextlib.nullcontext()
        with off:
            try:
                ok = bool(self._check(key))
            except Exception:
                ok = False
        self.answers[key] = ok
        return ok


def matches(got: torch.Tensor | None, want: torch.Tensor, tol: float) -> bool:
    """Same shape and a norm-relative error within ``tol`` (``want`` is the reference, in float64)."""
    return (got is not None and got.shape == want.shape
            and float((got.detach().double().to(want.device) - want).norm() / want.norm().clamp_min(1e-30)) <= tol)
