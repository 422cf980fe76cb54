"""The model zoo: one file a mechanism (registered with ``@register_mixer``), plus backbones."""
from __future__ import annotations

from typing import Any

from torch import nn

from ..registry import get_mixer
from .backbones import RECIPES, AutoEncoder, ModelConfig, TokenModel, VectorModel


def make_mixer_factory(name: str, knobs: dict[str, Any], cfg: ModelConfig):
    spec = get_mixer(name)

    def make(layer_idx: int) -> nn.Module:
        return spec.cls(cfg.d_model, num_heads=cfg.num_heads, layer_idx=layer_idx, **knobs)
    return make


def build_model(backbone: str, mixer: str, knobs: dict[str, Any], cfg: ModelConfig, *,
                vocab: int = 0, d_in: int = 0, d_out: int = 0) -> nn.Module:
    make = make_mixer_factory(mixer, knobs, cfg)
    if backbone == "lm":
        return TokenModel(vocab, cfg, make)
    if backbone == "autoencoder":
        return AutoEncoder(vocab, cfg, make)
    if backbone == "vector":
        return VectorModel(d_in, d_out, cfg, make)
    raise ValueError(f"unknown backbone {backbone!r}")


def mixers_of(model: nn.Module) -> list[nn.Module]:
    return model.trunk.mixers()


__all__ = ["RECIPES", "ModelConfig", "build_model", "make_mixer_factory", "mixers_of"]
