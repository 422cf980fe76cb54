"""The task contract: typed knobs, a batch, disjoint seed streams, metrics, leakage check.

A task is a dataclass of knobs (each declared with :func:`knob`, carrying its default,
range and help), registered with ``@register_task(name)``. ``generate(split, n, seed,
device)`` returns a :class:`Batch`, vectorized in torch and deterministic for a given
(seed, split). Train, validation and test draw from disjoint seed ranges.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..errors import UsageError

SPLITS = ("train", "val", "test")
IGNORE = -100


def knob(default, *, lo=None, hi=None, choices=None, help: str = "", axis: bool = True):
    """Declare a task knob: its default, allowed range or choices, and a help line."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices,
                                            "help": help, "axis": axis})


@dataclass
class Batch:
    """One generated set of examples, on one device.

    inputs:  (N, T) int64 tokens, or (N, T, d_in) float vectors.
    targets: (N, T) int64 with IGNORE where unsupervised, or (N, T, d_out) float.
    mask:    (N, T) bool, the positions that enter the loss and the metric.
    slices:  per-example labels, each a (N,) tensor (e.g. ``num_kv_pairs``).
    """
    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    slices: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def to(self, device) -> Batch:
        return Batch(self.inputs.to(device), self.targets.to(device), self.mask.to(device),
                     {k: v.to(device) for k, v in self.slices.items()})

    def index(self, idx) -> Batch:
        return Batch(self.inputs[idx], self.targets[idx], self.mask[idx],
                     {k: v[idx] for k, v in self.slices.items()})


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool


def seed_for(task: str, seed: int, split: str) -> int:
    """The generator seed of (task, seed, split); the three splits use disjoint ranges.

    The top two bits of the 63-bit seed name the split, so no train seed can ever equal a
    validation or test seed, whatever the user's seed.
    """
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    h = hashlib.sha256(f"{task}:{int(seed)}".encode()).digest()
    low = int.from_bytes(h[:8], "little") & ((1 << 61) - 1)
    return (SPLITS.index(split) << 61) | low


def generator(task: str, seed: int, split: str) -> torch.Generator:
    """A torch CPU generator for (task, seed, split). Torch's CPU generator keeps only the low
    32 bits of a seed, so the split goes into bits 30-31 of the seed it is given: the three
    splits still use disjoint seeds."""
    s = seed_for(task, seed, split)
    g = torch.Generator(device="cpu")
    g.manual_seed(((s >> 61) << 30) | (s & ((1 << 30) - 1)))
    return g


@dataclass
class Task:
    """Base of every task. Subclasses are dataclasses of knobs, registered by name."""

    name: ClassVar[str] = "?"
    suite: ClassVar[str] = "misc"
    version: ClassVar[int] = 1
    kind: ClassVar[str] = "classification"   # "classification" | "regression" | "training-free"
    backbone: ClassVar[str] = "lm"           # "lm" | "vector" | "autoencoder" | "none"
    metrics: ClassVar[tuple[Metric, ...]] = (Metric("accuracy", True),)
    # Examples per split when a run does not say otherwise.
    default_sizes: ClassVar[dict[str, int]] = {"train": 10_000, "val": 500, "test": 1_000}
    # Built-in presets: name -> knob overrides.
    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            m = f.metadata
            if m.get("choices") is not None and v not in m["choices"]:
                raise UsageError(f"{self.name}: knob {f.name}={v!r} not allowed; "
                                 f"allowed: {', '.join(map(str, m['choices']))}")
            if isinstance(v, bool) or m.get("choices") is not None:
                continue
            lo, hi = m.get("lo"), m.get("hi")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                raise UsageError(f"{self.name}: knob {f.name}={v!r} out of range; allowed: {rng}")
        self.validate()

    # -- to override ------------------------------------------------------------------
    def validate(self) -> None:
        """Cross-knob checks; raise UsageError with one clear line."""

    def generate(self, split: str, n: int, seed: int, device="cpu") -> Batch:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        """Length of an input sequence (the model's T)."""
        return int(self.L)

    @property
    def vocab_size(self) -> int:
        """Size of the token vocabulary (classification tasks)."""
        return int(self.V)

    @property
    def d_in(self) -> int:
        return 0

    @property
    def d_out(self) -> int:
        return 0

    # -- shared ------------------------------------------------------------------------
    @classmethod
    def knob_fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def from_knobs(cls, knobs: dict[str, Any] | None = None, preset: str | None = None) -> Task:
        """Build from string or typed knob values (command line, specs), validating names."""
        values: dict[str, Any] = {}
        if preset is not None:
            if preset not in cls.presets:
                raise UsageError(f"{cls.name}: unknown preset {preset!r}; allowed: "
                                 f"{', '.join(sorted(cls.presets)) or '(none)'}")
            values.update(cls.presets[preset])
        types = {f.name: f for f in cls.knob_fields()}
        for k, v in (knobs or {}).items():
            if k not in types:
                raise UsageError(f"{cls.name}: unknown knob {k!r}; allowed: "
                                 f"{', '.join(sorted(types))}")
            values[k] = parse_value(types[k].default, v, f"{cls.name}: knob {k}")
        return cls(**values)

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.knob_fields()}

    @property
    def primary(self) -> Metric:
        return self.metrics[0]

    def sizes(self) -> dict[str, int]:
        return dict(self.default_sizes)

    def generate_splits(self, seed: int, device="cpu", sizes: dict[str, int] | None = None):
        sizes = {**self.sizes(), **(sizes or {})}
        return {s: self.generate(s, sizes[s], seed, device) for s in SPLITS}


def parse_value(default, v, what: str):
    """Coerce ``v`` (often a string from the command line) to the type of ``default``."""
    if not isinstance(v, str):
        return v
    try:
        if isinstance(default, bool):
            if v.lower() in ("1", "true", "yes", "on"):
                return True
            if v.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(v)
        if isinstance(default, int):
            return int(v)
        if isinstance(default, float):
            return float(v)
    except ValueError:
        raise UsageError(f"{what}: cannot read {v!r} as {type(default).__name__}") from None
    return v


def leakage(train: Batch, test: Batch) -> float:
    """Fraction of test sequences whose inputs also occur in train (MAD's check)."""
    def keys(b: Batch) -> list[bytes]:
        x = b.inputs.detach().cpu().contiguous()
        rows = x.reshape(x.shape[0], -1)
        return [r.numpy().tobytes() for r in rows]
    seen = set(keys(train))
    test_keys = keys(test)
    return sum(k in seen for k in test_keys) / max(1, len(test_keys))
