"""gdn's and Mamba-2's fla paths with the dqkwg step as mixzoo's Triton kernel and as its PyTorch
version, side by side in one process, at the mad recipe's layer (``mixzoo bench mixers --shape mad``:
width 128 in 16 heads, batch 128, length 128, forward+backward, bf16), with softmax for the ratio.

    python benchmarks/dqkwg_paths.py [--rounds 3] [--mixers gdn,mamba]

Rounds alternate the two paths (torch, triton, torch, ...) so that a drift of the machine shows.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mixers", default="gdn,mamba")
    a = ap.parse_args(argv)
    import torch

    from mixzoo.bench.mixers import MAD, bench_mixers
    from mixzoo.kernels import fla_dqkwg
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    names = [m for m in a.mixers.split(",") if m]
    times: dict[tuple[str, str], list[float]] = {}
    backends: dict[tuple[str, str], str] = {}
    for r in range(a.rounds):
        for path in ("torch", "triton"):
            os.environ["MIXZOO_DQKWG"] = path
            for row in bench_mixers(["softmax"] + names, **MAD):
                key = (row["mechanism"], path)
                if "error" in row:
                    print(f"round {r} {path}: {row['mechanism']}: {row['error']}", flush=True)
                    continue
                times.setdefault(key, []).append(row["ms"])
                backends[key] = row["backend"]
        print(f"round {r}: " + ", ".join(f"{m}/{p} {v[-1]:.2f} ms" for (m, p), v in times.items()), flush=True)
    print(f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}; medians over {a.rounds} rounds, "
          f"each the median of {MAD['iters']} steps\n")
    print("| mechanism | dqkwg path | backend | fwd+bwd ms | x softmax (same path's run) | triton / torch |")
    print("|---|---|---|---|---|---|")
    for m in names:
        for p in ("torch", "triton"):
            if (m, p) not in times:
                continue
            ms = statistics.median(times[(m, p)])
            sm = statistics.median(times[("softmax", p)])
            ratio = "" if p == "torch" or (m, "torch") not in times else \
                f"{ms / statistics.median(times[(m, 'torch')]):.2f}"
            print(f"| {m} | {p} | {backends[(m, p)]} | {ms:.2f} | {ms / sm:.2f} | {ratio} |")
    os.environ.pop("MIXZOO_DQKWG", None)
    print("\ntriton kernel matched the PyTorch step here:",
          {f"K={K} V={V}": fla_dqkwg.triton_ok(K, V, 64) for K, V in ((16, 16), (64, 64))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
