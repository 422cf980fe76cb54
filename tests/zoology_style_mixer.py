"""Plugin for tests/test_input_checks.py: mixers written in zoology's style, unchanged.

Zoology's sequence mixers are built as ``cls(d_model, l_max, layer_idx=None, **kwargs)``: the
sequence length comes in, ``num_heads`` does not, and there is no ``backend`` attribute.
``ZoologyConv`` has exactly that constructor; ``ZoologyConvStrict`` takes no ``**kwargs`` (so a
``num_heads`` keyword would be a TypeError) and has typed knobs. Both are a causal long
convolution (zoology's BaseConv, without its short convolution): a learned filter as long as
``l_max``, applied by FFT. Load with ``--plugin tests/zoology_style_mixer.py``.
"""
from __future__ import annotations

import torch
from torch import nn

from mixzoo.registry import register_mixer


def _causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, D, T) inputs convolved causally with (D, T) filters."""
    T = u.shape[-1]
    n = 2 * T
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., :T]


@register_mixer("zoology-conv", search_space={"lr": ("log", 1e-3, 1e-2)})
class ZoologyConv(nn.Module):
    def __init__(self, d_model, l_max, layer_idx=None, **kwargs):
        super().__init__()
        self.l_max = l_max
        self.in_proj = nn.Linear(d_model, d_model)
        self.filter = nn.Parameter(torch.randn(d_model, l_max) / l_max)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        u = self.in_proj(x).transpose(1, 2)
        y = _causal_conv(u, self.filter[:, : x.shape[1]])
        return self.out_proj(y.transpose(1, 2))


@register_mixer("zoology-conv-strict", search_space={"lr": ("log", 1e-3, 1e-2)})
class ZoologyConvStrict(ZoologyConv):
    def __init__(self, d_model, l_max, layer_idx=None, gain: float = 1.0, bias=True):
        if gain <= 0:
            raise ValueError(f"gain={gain}; must be > 0")
        super().__init__(d_model, l_max, layer_idx)
        self.gain = gain
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x):
        return self.gain * super().forward(x)
