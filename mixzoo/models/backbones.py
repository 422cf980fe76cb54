"""Backbones that carry a mixer: token LM (zoology and MAD recipes), vector regression,
and MAD's autoencoder for compression. Backbones initialize only their own parameters;
a mechanism's parameters keep the mechanism's own initialization.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UsageError
from ..kernels import swiglu as _swiglu
from . import _fla
from .common import Embedding, RMSNorm, ShortConv


@dataclass
class ModelConfig:
    d_model: int = 64
    n_layers: int = 2            # mixer layers
    num_heads: int = 2
    mlp: str = "none"            # "none" (zoology MQAR) | "swiglu" (MAD) | "gelu"
    mlp_mult: float = 4.0
    norm: str = "layernorm"      # "layernorm" | "rmsnorm"
    tie_embeddings: bool = True
    short_conv: int = 0          # >0: a residual causal short-conv layer (this kernel size) before the mixers

    def __post_init__(self):
        for name, v, ok in (("mlp", self.mlp, ("none", "swiglu", "gelu")),
                            ("norm", self.norm, ("layernorm", "rmsnorm"))):
            if v not in ok:
                raise UsageError(f"model: {name}={v!r}; allowed: {', '.join(ok)}")
        if self.d_model % self.num_heads:
            raise UsageError(f"model: d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}")

    def as_dict(self) -> dict:
        return asdict(self)


RECIPES = {
    "zoology": dict(mlp="none", norm="layernorm", tie_embeddings=True),
    "mad": dict(mlp="swiglu", norm="rmsnorm", tie_embeddings=False, d_model=128, num_heads=16),
    # zoology's "Based recipe": a short-convolution layer first, then the mixers, no MLP
    "based": dict(mlp="none", norm="layernorm", tie_embeddings=True, short_conv=3),
}


def _norm(kind: str, d: int) -> nn.Module:
    return nn.LayerNorm(d) if kind == "layernorm" else RMSNorm(d)


SWIGLU_MULTIPLE_OF = 16


def mlp_hidden(d: int, kind: str, mult: float) -> int:
    """The MLP's inner width: ``d * mult`` (gelu, MAD's ``Mlp``); for SwiGLU two thirds of it rounded up
    to a multiple of 16, as MAD's ``GLU`` (mad/model/layers/mlp.py: ``int(2 * dim * 4 / 3)`` up to
    ``multiple_of=16``; 352 at width 128), which also keeps the projections' rows aligned for tensor-core
    GEMMs (an inner width of 341 made every one of them a misaligned kernel on the GPU)."""
    if kind != "swiglu":
        return int(d * mult)
    h = int(d * mult * 2 / 3)
    return SWIGLU_MULTIPLE_OF * -(-h // SWIGLU_MULTIPLE_OF)


class MLP(nn.Module):
    def __init__(self, d: int, kind: str, mult: float):
        super().__init__()
        self.kind = kind
        h = mlp_hidden(d, kind, mult)
        self.fc1 = nn.Linear(d, 2 * h if kind == "swiglu" else h, bias=False)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        if self.kind == "swiglu":
            h = self.fc1(x)
            if _swiglu.runs_on(h):    # silu(a) * b of fc1's halves as mixzoo's kernels (folded when stacking)
                return self.fc2(_fla._op("mixzoo.kernels.swiglu", "swiglu")(h))
            a, b = h.chunk(2, dim=-1)
            return self.fc2(F.silu(a) * b)
        return self.fc2(F.gelu(self.fc1(x)))


def _add_norm(norm: nn.Module, x: torch.Tensor, r: torch.Tensor | None, out_dtype: torch.dtype | None = None):
    """(x + r, norm(x + r)); (x, norm(x)) without r. An RMSNorm adds and norms in one kernel each way where
    mixzoo's kernels run (``RMSNorm(residual=...)``); ``out_dtype`` casts the norm for a consumer that would."""
    if r is None:
        return x, norm(x)
    if isinstance(norm, RMSNorm):
        return norm(x, residual=r, out_dtype=out_dtype)
    s = x + r
    return s, norm(s)


class Block(nn.Module):
    """Pre-norm: x + mixer(norm1(x)), then x + mlp(norm2(x)). ``forward(x, r)`` takes the residual stream x and
    the previous block's last branch output r not yet added, and returns its own (x, r) the same way, so that
    each residual add is made by the norm after it (``_add_norm``: one kernel with an RMSNorm); ``Trunk`` adds
    the last r in its final norm. The sums are the same."""

    def __init__(self, cfg: ModelConfig, mixer: nn.Module):
        super().__init__()
        self.norm1 = _norm(cfg.norm, cfg.d_model)
        self.mixer = mixer
        self.mlp = MLP(cfg.d_model, cfg.mlp, cfg.mlp_mult) if cfg.mlp != "none" else None
        self.norm2 = _norm(cfg.norm, cfg.d_model) if self.mlp is not None else None

    def forward(self, x, r=None):
        x, h = _add_norm(self.norm1, x, r)
        r = self.mixer(h)
        if self.mlp is not None:
            # the MLP's first op is a Linear, which under autocast casts its input: the norm is written cast
            kind = x.device.type
            x, h = _add_norm(self.norm2, x, r, torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind)
                             else None)
            r = self.mlp(h)
        return x, r


MixerFactory = Callable[[int], nn.Module]   # layer_idx -> mixer


class Trunk(nn.Module):
    """The blocks and final norm shared by every backbone."""

    def __init__(self, cfg: ModelConfig, make_mixer: MixerFactory):
        super().__init__()
        self.conv = ShortConv(cfg.d_model, cfg.short_conv) if cfg.short_conv else None
        self.conv_norm = _norm(cfg.norm, cfg.d_model) if cfg.short_conv else None
        self.blocks = nn.ModuleList(Block(cfg, make_mixer(i)) for i in range(cfg.n_layers))
        self.norm = _norm(cfg.norm, cfg.d_model)

    def forward(self, x):
        if self.conv is not None:
            x = x + self.conv(self.conv_norm(x))
        r = None
        for b in self.blocks:
            x, r = b(x, r)
        return _add_norm(self.norm, x, r)[1]

    def mixers(self) -> list[nn.Module]:
        return [b.mixer for b in self.blocks]


def _init_own(module: nn.Module, skip: list[nn.Module], n_layers: int) -> None:
    """GPT-2 style init of the backbone's own Linear/Embedding weights, never a mixer's."""
    skipped = {id(p) for m in skip for p in m.parameters()}
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) and id(m.weight) not in skipped:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith("fc2") else 0.02
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class TokenModel(nn.Module):
    """Embedding, pre-norm blocks (mixer, optional MLP), final norm, vocabulary head."""

    def __init__(self, vocab: int, cfg: ModelConfig, make_mixer: MixerFactory):
        super().__init__()
        self.embed = Embedding(vocab, cfg.d_model)
        self.trunk = Trunk(cfg, make_mixer)
        self.head = nn.Linear(cfg.d_model, vocab, bias=False)
        _init_own(self, self.trunk.mixers(), cfg.n_layers)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens, select=None):
        """Logits (B, T, vocab); with ``select`` (B, K) positions, only those: (B, K, vocab).
        The trunk is causal, so selecting after it changes nothing but the head's cost."""
        h = self.trunk(self.embed(tokens))
        if select is not None:
            h = h.gather(1, select.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        return self.head(h)


class VectorModel(nn.Module):
    """Linear read-in of (B, T, d_in) vectors, blocks, linear read-out to d_out."""

    def __init__(self, d_in: int, d_out: int, cfg: ModelConfig, make_mixer: MixerFactory):
        super().__init__()
        self.read_in = nn.Linear(d_in, cfg.d_model)
        self.trunk = Trunk(cfg, make_mixer)
        self.read_out = nn.Linear(cfg.d_model, d_out)
        _init_own(self, self.trunk.mixers(), cfg.n_layers)

    def forward(self, x):
        return self.read_out(self.trunk(self.read_in(x)))


def sincos(T: int, d: int, device) -> torch.Tensor:
    pos = torch.arange(T, device=device, dtype=torch.float32)[:, None]
    inv = 10000 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    pe = torch.zeros(T, d, device=device)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)[:, : d // 2]
    return pe


class AutoEncoder(nn.Module):
    """MAD's compression backbone: the mixer stack encodes, the last position is pooled,
    and a fixed decoder (sin-cos position per output slot, two norm-Linear-GELU layers,
    norm, unembedding) reconstructs every input token."""

    def __init__(self, vocab: int, cfg: ModelConfig, make_mixer: MixerFactory):
        super().__init__()
        d = cfg.d_model
        self.embed = Embedding(vocab, d)
        self.trunk = Trunk(cfg, make_mixer)
        self.dec = nn.ModuleList(nn.Sequential(_norm(cfg.norm, d), nn.Linear(d, d), nn.GELU())
                                 for _ in range(2))
        self.dec_norm = _norm(cfg.norm, d)
        self.head = nn.Linear(d, vocab, bias=False)
        _init_own(self, self.trunk.mixers(), cfg.n_layers)

    def forward(self, tokens):
        B, T = tokens.shape
        z = self.trunk(self.embed(tokens))[:, -1:, :]              # (B, 1, d)
        h = z + sincos(T, z.shape[-1], tokens.device)[None].to(z.dtype)
        for layer in self.dec:
            h = layer(h)
        return self.head(self.dec_norm(h))
