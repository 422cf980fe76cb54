"""A mixer that does not mix: the cost floor of the MAD projection (a benchmark plugin, not a mechanism).

Every mechanism of the zoo projects its input to queries, keys and values and its output back through a
d x d matrix, inside the backbone's blocks (embedding, RMS norms, SwiGLU, loss, optimizer). ``floor`` keeps
exactly that and replaces the sequence mixing by one elementwise product per token, o = q * sigmoid(k) * v,
so a training step with it costs what every mechanism pays besides its mixing. Its row of the MAD projection
(``mixzoo bench throughput --project``) is therefore a lower bound on each mechanism's row, and eight times it
a lower bound on the eight together, however fast their mixing kernels become.

    mixzoo --plugin benchmarks/floor_mixer.py bench throughput --shape mad,mad256,mad512,mad1024 \\
        --modes stacked+graphed --K 6 --procs= floor
"""
from __future__ import annotations

import torch
from torch import nn

from mixzoo.registry import register_mixer


@register_mixer("floor", search_space={"lr": ("log", 1e-4, 3e-2)})
class FloorMixer(nn.Module):
    """Input and output projections of a mixer, no mixing along the sequence (causal trivially)."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "no-mixing"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(q * torch.sigmoid(k) * v)

    def state_size(self, seq_len: int) -> int:
        return 0
