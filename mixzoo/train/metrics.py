"""Metrics reduced on the device; one host read per evaluation.

Classification: ``accuracy`` (mean over examples of the accuracy on their supervised
positions, zoology's definition), ``token_accuracy`` (micro over supervised positions) and
``class_accuracy`` (mean over target classes of per-class recall, MAD's torchmetrics default).
Regression: ``mse`` (mean squared error per coordinate over supervised positions) and
``nmse`` (mse divided by the mean squared target, so 1.0 is the zero predictor).
Per-slice variants are named ``<metric>/<slice>=<value>``.
"""
from __future__ import annotations

import torch


class Accumulator:
    """Sums for every metric of one evaluation, kept on the device."""

    def __init__(self, kind: str, n_classes: int = 0):
        self.kind, self.n_classes = kind, n_classes
        self.sums: dict[str, torch.Tensor] = {}
        self.slice_sums: dict[tuple[str, int], torch.Tensor] = {}
        self.slices_seen: dict[str, torch.Tensor] = {}

    def _add(self, key: str, value: torch.Tensor):
        self.sums[key] = self.sums[key] + value if key in self.sums else value.clone()

    def update(self, out: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
               slices: dict[str, torch.Tensor], loss_sum: torch.Tensor | None = None):
        m = mask.float()
        n_sup = m.sum(1)                                               # (N,)
        has = (n_sup > 0).float()
        if self.kind == "classification":
            hit = (out.argmax(-1) == targets).float() * m
            per_ex = hit.sum(1) / n_sup.clamp_min(1)
            self._add("ex_correct", (per_ex * has).sum())
            self._add("ex_count", has.sum())
            self._add("tok_correct", hit.sum())
            self._add("tok_count", m.sum())
            if self.n_classes:
                t = targets.clamp_min(0)
                self._add("cls_correct", torch.zeros(self.n_classes, device=out.device)
                          .index_add_(0, t[mask], hit[mask]))
                self._add("cls_count", torch.zeros(self.n_classes, device=out.device)
                          .index_add_(0, t[mask], m[mask]))
            score = per_ex
        else:
            err = ((out.float() - targets.float()) ** 2).mean(-1) * m     # (N, T)
            sq = (targets.float() ** 2).mean(-1) * m
            self._add("sq_err", err.sum())
            self._add("sq_tgt", sq.sum())
            self._add("tok_count", m.sum())
            score = err.sum(1) / n_sup.clamp_min(1)
        if loss_sum is not None:
            self._add("loss_sum", loss_sum.detach().float())
        for name, lab in slices.items():
            # one-hot over slice values seen in this batch, accumulated per value
            vals = torch.unique(lab)
            onehot = (lab[None, :] == vals[:, None]).float() * has[None, :]
            key_s = f"slice:{name}"
            self.slice_sums.setdefault(key_s, [])
            self.slice_sums[key_s].append((vals, onehot @ score, onehot.sum(1)))

    def compute(self) -> dict[str, float]:
        """Reduce to floats: the one host sync of an evaluation."""
        keys = sorted(self.sums)
        flat = torch.cat([self.sums[k].reshape(-1).float() for k in keys]).cpu()
        vals, off = {}, 0
        for k in keys:
            n = self.sums[k].numel()
            vals[k] = flat[off:off + n]
            off += n
        out: dict[str, float] = {}
        if self.kind == "classification":
            out["accuracy"] = float(vals["ex_correct"] / vals["ex_count"].clamp_min(1))
            out["token_accuracy"] = float(vals["tok_correct"] / vals["tok_count"].clamp_min(1))
            if "cls_count" in vals:
                present = vals["cls_count"] > 0
                rec = vals["cls_correct"][present] / vals["cls_count"][present]
                out["class_accuracy"] = float(rec.mean()) if rec.numel() else float("nan")
            out["n_supervised"] = float(vals["tok_count"])
        else:
            cnt = vals["tok_count"].clamp_min(1)
            out["mse"] = float(vals["sq_err"] / cnt)
            out["nmse"] = float(vals["sq_err"] / vals["sq_tgt"].clamp_min(1e-12))
            out["n_supervised"] = float(vals["tok_count"])
        if "loss_sum" in vals:
            out["loss"] = float(vals["loss_sum"] / vals["tok_count"].clamp_min(1))
        base = "accuracy" if self.kind == "classification" else "mse"
        for key_s, parts in self.slice_sums.items():
            name = key_s.split(":", 1)[1]
            acc: dict[int, list[float]] = {}
            for v, s, c in parts:
                for vi, si, ci in zip(v.tolist(), s.tolist(), c.tolist()):
                    a = acc.setdefault(int(vi), [0.0, 0.0])
                    a[0] += si
                    a[1] += ci
            if len(acc) > 1:
                for vi, (s, c) in sorted(acc.items()):
                    out[f"{base}/{name}={vi}"] = s / max(c, 1)
        return out
