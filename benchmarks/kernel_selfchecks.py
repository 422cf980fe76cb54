"""Each of mixzoo's kernel self-checks on this device, with what went wrong where one fails: the
exception, or each output's norm-relative error against the float64 reference (the checks themselves
only answer yes or no). Prints one line per kernel.

    python benchmarks/kernel_selfchecks.py
    MIXZOO_SSD_DOT=ieee CUDA_LAUNCH_BLOCKING=1 python benchmarks/kernel_selfchecks.py
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ssd_detail(idx: int, form: str) -> str:
    from mixzoo.kernels import ssd_intra
    return "; ".join(f"C={c} K={k} V={v}: " + " ".join(f"{e:.1e}" for e in errs)
                     for (c, k, v), errs in ssd_intra.errors_here(idx, form))


def main() -> int:
    import torch
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    idx = 0 if dev.type == "cuda" else -1
    from mixzoo.kernels import causal_conv, rmsnorm, rope, ssd_intra, swiglu
    for name, mod in (("swiglu", swiglu), ("rmsnorm", rmsnorm), ("rope", rope), ("causal_conv", causal_conv)):
        try:
            ok = mod._matches_here(idx)
            print(f"{name}: {'matches' if ok else 'does not match'}", flush=True)
        except Exception:
            print(f"{name}: raised\n{traceback.format_exc()}", flush=True)
    # the SSD kernels in the form MIXZOO_SSD_DOT picks (default bf16): a form that faults on the device
    # poisons the process, so each form is checked in a process of its own
    form = ssd_intra.form()
    try:
        ok = ssd_intra._matches_here((idx, form))
        print(f"ssd_intra ({form}): {'matches' if ok else 'does not match'}", flush=True)
        print(f"ssd_intra ({form}) errors (o, dq, dk, dv, dg, dks):", ssd_detail(idx, form), flush=True)
    except Exception:
        print(f"ssd_intra ({form}): raised\n{traceback.format_exc()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
