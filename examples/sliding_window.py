"""Example plugin: sliding-window attention, a mechanism the zoo does not ship.

Each query attends (softmax) to itself and the previous ``window - 1`` positions only, so its
state is ``window`` keys and values however long the sequence is. Everything a mechanism needs
is in this one file: the class, its knobs, its Optuna search space, ``backend`` and
``state_size``.

    mixzoo --plugin examples/sliding_window.py check-mixer swa
    mixzoo --plugin examples/sliding_window.py run mqar --model swa --preset demo --steps 300
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mixzoo.models.common import merge_heads, rope, split_heads
from mixzoo.registry import register_mixer


@register_mixer("swa", search_space={
    "lr": ("log", 1e-4, 3e-2),                 # always search the learning rate over a wide range
    "weight_decay": ("cat", [0.0, 0.1]),
    "window": ("cat", [16, 32, 64, 128]),      # the mechanism's own knob
})
class SlidingWindowAttention(nn.Module):
    """Causal softmax attention restricted to the last ``window`` positions."""

    def __init__(self, d_model: int, *, num_heads: int = 2, layer_idx: int = 0, window: int = 32):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} not divisible by num_heads={num_heads}")
        if window < 1:
            raise ValueError(f"window={window}; must be >= 1")
        self.h, self.window = num_heads, window
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.backend = "sdpa-masked"             # the path used; lands in every leaderboard row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = (split_heads(t, self.h) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = rope(q), rope(k)
        i = torch.arange(T, device=x.device)
        lag = i[:, None] - i[None, :]
        allowed = (lag >= 0) & (lag < self.window)           # causal and inside the window
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.out(merge_heads(o))

    def state_size(self, seq_len: int) -> int:
        return 2 * self.qkv.in_features * min(seq_len, self.window)
