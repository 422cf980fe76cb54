"""Each of mixzoo's kernel self-checks on this device, with what went wrong where one fails: the
exception, or each output's norm-relative error against the float64 reference (the checks themselves
only answer yes or no). Prints one line per kernel.

    python benchmarks/kernel_selfchecks.py
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ssd_detail(idx: int) -> str:
    from mixzoo.kernels import ssd_intra
    return "; ".join(f"C={c} K={k} V={v}: " + " ".join(f"{e:.1e}" for e in errs)
                     for (c, k, v), errs in ssd_intra.errors_here(idx))


def main() -> int:
    import torch
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    idx = 0 if dev.type == "cuda" else -1
    from mixzoo.kernels import causal_conv, rmsnorm, rope, ssd_intra, swiglu
    for name, mod in (("swiglu", swiglu), ("rmsnorm", rmsnorm), ("rope", rope), ("causal_conv", causal_conv),
                      ("ssd_intra", ssd_intra)):
        try:
            ok = mod._matches_here(idx)
            print(f"{name}: {'matches' if ok else 'does not match'}", flush=True)
        except Exception:
            print(f"{name}: raised\n{traceback.format_exc()}", flush=True)
    try:
        print("ssd_intra errors (o, dq, dk, dv, dg, dks):", ssd_detail(idx), flush=True)
    except Exception:
        print(f"ssd_intra detail raised\n{traceback.format_exc()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
