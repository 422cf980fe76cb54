# session 2026-12-06f call 1 (planned in 2026-12-06e as its call4.sh; ran on one H100 80GB HBM3 at commit b7d74a5). The load-alignment fix, timed:
# LLA's kernels with the heads' strides passed in units of the rows' alignment (VEC) so that a head of 8 loads in
# vectors, contiguous per head and read strided straight from the qkv prologue's (B, T, H, D) output (no copy at
# all), against the padded copies (the default), stacked+graphed K = 6 at lengths 512 and 1024, back to back, each in
# its own process; the GPU test of the three ways of handing the heads over. Then softmax's attention kernels with
# their strides in units of the rows' alignment (MIXZOO_ATTN_STRIDES=aligned), alone and with the qkv prologue (whose
# (B, T, H, D) q, k, v have a head stride of 8: the same defect may be what made it 0.95-0.99x), against the default,
# at MAD's four lengths; its GPU test. Where a configuration is faster at every length, make it the default
# (mixzoo/kernels/__init__.py: the first entry of LLA_HEADS, ATTN_STRIDES, QKV_PROLOGUE) and rerun the table.
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad512,mad1024 --steps 20 --warmup 5 --procs= --modes stacked+graphed --K 6"
MIXZOO_LLA_HEADS=contiguous TPN=-lla-contiguous-vec TP_ARGS="$S lla" T=45 bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=strided MIXZOO_QKV_PROLOGUE=fused TPN=-lla-strided-prologue-vec TP_ARGS="$S lla" T=45 \
  bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=padded TPN=-lla-padded-vec TP_ARGS="$S lla" T=45 bash scripts/gpu-zoo.sh tput
GTN=-strided-vec KEXPR="strided" K="tests/gpu/test_lla_kernel.py" T=40 bash scripts/gpu-zoo.sh gputests
S6="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_ATTN_STRIDES=aligned TPN=-softmax-aligned TP_ARGS="$S6 softmax" T=80 bash scripts/gpu-zoo.sh tput
MIXZOO_ATTN_STRIDES=aligned MIXZOO_QKV_PROLOGUE=fused TPN=-softmax-aligned-prologue TP_ARGS="$S6 softmax" T=80 \
  bash scripts/gpu-zoo.sh tput
MIXZOO_ATTN_STRIDES=plain TPN=-softmax-plain TP_ARGS="$S6 softmax" T=80 bash scripts/gpu-zoo.sh tput
GTN=-attn-aligned KEXPR="aligned" K="tests/gpu/test_attn_gpu.py" T=60 bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-lla-*-vec.md logs/throughput-softmax-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 4; done
grep -h -E "passed|failed|^FAILED|lla B=|attention B=" logs/gputests-strided-vec.log logs/gputests-attn-aligned.log | tail -n 12
