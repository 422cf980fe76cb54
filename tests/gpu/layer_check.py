"""What the GPU layer tests share: a norm-relative error, one forward and backward of a layer (under bf16
autocast or not) with its output, input gradient and every parameter's gradient, and a call's device time."""
from __future__ import annotations

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def layer_grads(mod: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, amp: bool) -> list[torch.Tensor]:
    """[output, dL/dx, each parameter's gradient] of L = Σ mod(x)·dy, under bf16 autocast when ``amp``."""
    x = x.clone().requires_grad_()
    mod.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        y = mod(x)
    (y.to(dy.dtype) * dy).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in mod.parameters()]


def timed(fn, rounds: int = 2, iters: int = 50, graph: bool = True) -> float:
    """Best over ``rounds`` of the mean ms of ``fn()`` (a forward and backward) as a CUDA graph replayed
    ``iters`` times: the device's time, as graphed and stacked+graphed steps run it (an eager loop of
    these small calls measures the host's launches instead). ``graph=False``: the eager loop (for
    calls this harness cannot capture: on the H200 the short convolution's and the SSD layer's
    captures here failed with cudaErrorStreamCaptureImplicit, while the trainer's captured steps with
    the same kernels run, tests/gpu/test_throughput_gpu.py)."""
    if not graph:
        best = float("inf")
        for _ in range(rounds):
            for _ in range(3):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end) / iters)
        return best
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    best = float("inf")
    for _ in range(rounds):
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / iters)
    return best
