"""gdn's, GLA's and MesaNet's fla paths with heads of 8 handed to fla as they are (``MIXZOO_FLA_PAD=none``)
against padded to 16 (the default): does fla (and mixzoo's kernels on those paths) give the same layer, and
is it faster? gdn and GLA also with mixzoo's recurrent scans (``triton-rec``, mixzoo.kernels.recurrent).
At the mad recipe's layer (width 128 in 16 heads), under bf16 autocast:

* agreement: output and gradients (input and every parameter) of the unpadded layer against the padded one,
  and each against the layer's float64 reference path (``backend="torch"``), at batch 8, length 256;
* time: the layer's forward+backward at batch 768 (six stacked models of 128), lengths 256 and 1024.

Each (mechanism, padding) runs in its own process (a kernel fault poisons the CUDA context), printing one JSON
row; a process that fails is reported with its last lines.

    python benchmarks/fla_unpadded.py --mixers gdn,gla,mesa --T 256,1024 --out logs/fla-unpadded.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys

import torch


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _grads(m, x, dy, amp: bool):
    x = x.clone().requires_grad_()
    m.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        y = m(x)
    (y.to(dy.dtype) * dy).sum().backward()
    return y.detach(), x.grad, torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


# each variant's environment: fla's calls with heads padded to 16 in memory, unpadded, and (gdn and GLA) mixzoo's
# recurrent scan instead of fla (the fla variants run with MIXZOO_GDN=fla MIXZOO_GLA_CORE=fla)
VARIANTS = {"16": {"MIXZOO_FLA_PAD": "16"}, "none": {"MIXZOO_FLA_PAD": "none"},
            "rec": {"MIXZOO_GDN": "rec", "MIXZOO_GLA_CORE": "rec"}}


def one(mixer: str, lengths: list[int], B: int) -> dict:
    """This process's row (MIXZOO_FLA_PAD as the caller set it)."""
    import triton.testing

    from mixzoo.registry import build_mixer, get_mixer
    torch.manual_seed(0)
    m = build_mixer(get_mixer(mixer), 128, num_heads=16, layer_idx=0, l_max=max(lengths)).cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8, 256, 128, device="cuda", generator=g)
    dy = torch.randn(8, 256, 128, device="cuda", generator=g)
    fast = _grads(m, x, dy, True)
    row = dict(mixer=mixer, pad=os.environ.get("MIXZOO_FLA_PAD", "16"), backend=m.backend)
    ref = copy.deepcopy(m).double()
    ref.requested = "torch"
    want = _grads(ref, x.double(), dy.double(), False)
    row.update(err_vs_f64=[_rel(a, b) for a, b in zip(fast, want)], ref_backend=ref.backend)
    variant = "rec" if m.backend == "triton-rec" else row["pad"]
    torch.save([t.cpu() for t in fast], f"/tmp/fla_unpadded-{mixer}-{variant}.pt")
    for T in lengths:
        xb = torch.randn(B, T, 128, device="cuda", requires_grad=True)

        def step(xb=xb):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = m(xb)
            y.float().sum().backward()
        row[f"ms_T{T}"] = triton.testing.do_bench(step, warmup=5, rep=60, return_mode="median")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixers", default="gdn,gla,mesa")
    ap.add_argument("--T", default="256,1024")
    ap.add_argument("--B", type=int, default=768)
    ap.add_argument("--variants", default="16,none,rec", help="of 16, none, rec (rec: gdn and GLA only); 16 always runs")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    lengths = [int(t) for t in a.T.split(",")]
    if a.one:
        print("ROW " + json.dumps(one(a.one, lengths, a.B)), flush=True)
        return 0
    rows = []
    for mixer in a.mixers.split(","):
        asked = {"16", *a.variants.split(",")}
        variants = [v for v in VARIANTS if v in asked and (mixer in ("gdn", "gla") or v != "rec")]
        for variant in variants:
            env = {**os.environ, **VARIANTS[variant], **({"MIXZOO_GDN": "fla", "MIXZOO_GLA_CORE": "fla"} if variant != "rec" else {})}
            p = subprocess.run([sys.executable, __file__, "--one", mixer, "--T", a.T, "--B", str(a.B)],
                               capture_output=True, text=True, env=env)
            got = [ln for ln in p.stdout.splitlines() if ln.startswith("ROW ")]
            row = json.loads(got[-1][4:]) if got else dict(
                mixer=mixer, error=f"rc {p.returncode}: " + " | ".join((p.stderr or p.stdout).splitlines()[-4:]))
            rows.append(dict(row, variant=variant))
        pair = [r for r in rows if r["mixer"] == mixer]
        if all("error" not in r for r in pair):
            files = {r["variant"]: f"/tmp/fla_unpadded-{mixer}-{r['variant']}.pt" for r in pair}
            padded = torch.load(files["16"])
            for r in pair[1:]:
                r["vs_padded"] = [_rel(u, v) for u, v in zip(torch.load(files[r["variant"]]), padded)]
        for r in pair:
            print(json.dumps(r), flush=True)
    if a.out:
        from mixzoo.leaderboard.export import write_atomic
        write_atomic(a.out, json.dumps(dict(device=torch.cuda.get_device_name(), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
