"""MesaNet's fla path at the mad recipe's heads of 8 with the head zero-padded to each width asked
for (``mixzoo.models.mesa.FLA_HEAD_DIMS``): errors of the bf16 fla path and of the bf16 PyTorch
path against the float64 exact read-out (output and every gradient, batch 2, length 100), and the
layer's forward+backward time at MAD's shape (``bench mixers --shape mad``: eager and graphed),
with softmax for the ratio. One process per width, since a width the kernel cannot take may fault
and end its process.

    python benchmarks/mesa_head_pad.py [WIDTH ...]     (default 16 32 64)
"""
from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys
import mixzoo.models.mesa as mesa
w = int(sys.argv[1])
mesa.FLA_HEAD_DIMS = (w, 128)
sys.path.insert(0, "benchmarks")
from fast_vs_f64 import errors
from mixzoo.bench.mixers import MAD, bench_mixers
out = {"width": w}
try:
    e = errors("mesa", 16)
    out["errors"] = {k: {"output": v["output"], "worst_grad": max(x for n, x in v.items() if n != "output")}
                     for k, v in e.items()}
except Exception as ex:
    out["errors_error"] = f"{type(ex).__name__}: {ex}"[:300]
out["bench"] = bench_mixers(["softmax", "mesa"], **MAD)
print("RESULT " + json.dumps(out), flush=True)
"""


def main(argv=None) -> int:
    widths = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or [16, 32, 64]
    rows = []
    for w in widths:
        p = subprocess.run([sys.executable, "-c", CHILD, str(w)], capture_output=True, text=True, timeout=600)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            print(f"width {w}: rc {p.returncode}: {' | '.join(tail)}", flush=True)
            rows.append({"width": w, "rc": p.returncode, "error": tail})
            continue
        r = json.loads(line[len("RESULT "):])
        rows.append(r)
        b = {x["mechanism"]: x for x in r["bench"]}
        sm, me = b.get("softmax", {}), b.get("mesa", {})
        errs = r.get("errors") or {}
        es = "; ".join(f"{k}: out {v['output']:.1e} grad {v['worst_grad']:.1e}" for k, v in errs.items()) \
            or r.get("errors_error", "")
        nan = float("nan")
        gm, gs = me.get("graphed_ms", nan), sm.get("graphed_ms", nan)
        t = (f"eager {me['ms']:.2f} ms ({me['ms'] / sm['ms']:.2f}x softmax), graphed {gm:.2f} ms ({gm / gs:.2f}x)"
             if "ms" in me and "ms" in sm else me.get("error", "no time"))
        print(f"width {w}: {t}; vs float64: {es}", flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
