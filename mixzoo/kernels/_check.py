"""What mixzoo's kernels share: whether Triton's interpreter is on (the CPU tests run the kernels in
it), and the self-check that enables a kernel where it has matched its PyTorch reference."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable

import torch


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class DeviceCheck:
    """``check(key)``: whether a kernel gives its PyTorch reference's numbers at ``key`` (a device
    index, -1 for the interpreter on the CPU, or a tuple with sizes), asked once per key and
    remembered; an exception is a no.

    It is asked for from a layer's forward, which stacked training runs under ``torch.func.vmap``,
    evaluation under ``torch.no_grad`` and training under autocast, so it runs in a thread of its own,
    where none of them is on: under vmap a check's ``requires_grad_`` is refused even with functorch
    disabled, and the answer No was kept for the process (on the H200 a fresh stacked run then trained
    without any kernel; before, the dqkwg check's random inputs were refused the same way). Inside a CUDA graph capture it
    cannot run (it reads the device): the answer there is False for that call only, not remembered."""

    def __init__(self, check: Callable[[Hashable], bool]):
        self._check = check
        self.answers: dict[Hashable, bool] = {}

    def __call__(self, key: Hashable) -> bool:
        if key in self.answers:
            return self.answers[key]
        if not interpreting() and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return False
        # in a thread of its own: functorch's transforms (vmap), grad mode and autocast are per thread, and
        # the check needs none of its caller's (its references take gradients, in their own dtypes)
        answer: list[bool] = []

        def run() -> None:
            try:
                answer.append(bool(self._check(key)))
            except Exception:
                answer.append(False)
        t = threading.Thread(target=run, name="mixzoo-kernel-check")
        t.start()
        t.join()
        ok = bool(answer and answer[0])
        self.answers[key] = ok
        return ok


def matches(got: torch.Tensor | None, want: torch.Tensor, tol: float) -> bool:
    """Same shape and a norm-relative error within ``tol`` (``want`` is the reference, in float64)."""
    return (got is not None and got.shape == want.shape
            and float((got.detach().double().to(want.device) - want).norm() / want.norm().clamp_min(1e-30)) <= tol)
