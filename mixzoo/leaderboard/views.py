"""Views over the store (aggregates are computed, never stored) and plain-text tables."""
from __future__ import annotations

import json
import math

import pyarrow as pa


def format_table(headers: list[str], rows: list[list]) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(r, widths))
            for r in cells]
    return "\n".join(out)


def _numeric(s: str) -> bool:
    try:
        float(s.split(" ")[0])
        return True
    except ValueError:
        return False


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def print_rows(rows: list[dict]) -> None:
    headers = ["task", "model", "backend", "seed", "metric", "test", "val", "steps", "steps/s",
               "params", "state"]
    body = [[r["task"], r["model"], r["backend"], r["seed"], r["metric_name"],
             r["metric_value"], r["val_metric_value"], r["steps"], r["steps_per_s"], r["params"],
             r["state"]] for r in rows]
    print(format_table(headers, body))


def summary_rows(table: pa.Table, task: str | None = None) -> tuple[list[str], list[list]]:
    """Mean ± std over seeds per (task, knobs, model, hparams), best first per task."""
    rows = table.to_pylist()
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if task and r["task"] != task:
            continue
        if r["state"] != "COMPLETE":
            continue
        key = (r["task"], r["knobs_json"], r["model"], r["backend"], r["hparams_json"])
        groups.setdefault(key, []).append(r)
    out = []
    for (t, knobs, model, backend, _hp), rs in groups.items():
        vals = [r["metric_value"] for r in rs]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        k = json.loads(knobs)
        setting = ",".join(f"{a}={b}" for a, b in k.items() if a in ("V", "L", "kv", "seq_len",
                                                                     "vocab_size", "num_kv_pairs"))
        sps = sum(r["steps_per_s"] or 0 for r in rs) / len(rs)
        out.append((t, rs[0]["higher_is_better"], mean,
                    [t, setting, model, backend, rs[0]["metric_name"],
                     f"{mean:.4f} ± {std:.4f}", len(rs), rs[0]["params"], round(sps, 1)]))
    out.sort(key=lambda x: (x[0], -x[2] if x[1] else x[2]))
    headers = ["task", "setting", "model", "backend", "metric", "test (mean ± std)", "seeds",
               "params", "steps/s"]
    return headers, [o[3] for o in out]


def print_summary(table: pa.Table, task: str | None = None) -> None:
    headers, body = summary_rows(table, task)
    if not body:
        print("(leaderboard is empty)")
        return
    print(format_table(headers, body))
