# session 2026-12-06e call 4 (the device time's remainder): LLA's kernels with the heads' strides passed in units of
# the rows' alignment (VEC, so that a head of 8 is loaded in vectors), contiguous per head (the default) against the
# padded copies as before, stacked+graphed K = 6 at lengths 512 and 1024, back to back; then the GPU test of the
# three ways of handing the heads over (equal to float32 summation order, timed). Then softmax's attention kernels with
# their strides in units of the rows' alignment (MIXZOO_ATTN_STRIDES=aligned) against as they are, the same way, and
# its GPU test. Not run in session 2026-12-06e (its device time ran out).
set -o pipefail
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
S="--shape mad512,mad1024 --steps 20 --warmup 5 --procs= --modes stacked+graphed --K 6"
TPN=-lla-contiguous-vec TP_ARGS="$S lla" T=45 bash scripts/gpu-zoo.sh tput
MIXZOO_LLA_HEADS=padded TPN=-lla-padded-vec TP_ARGS="$S lla" T=45 bash scripts/gpu-zoo.sh tput
GTN=-strided-vec KEXPR="strided" K="tests/gpu/test_lla_kernel.py" T=40 bash scripts/gpu-zoo.sh gputests
S6="--shape mad,mad256,mad512,mad1024 --steps 30 --warmup 10 --procs= --modes stacked+graphed --K 6"
MIXZOO_ATTN_STRIDES=aligned TPN=-softmax-aligned TP_ARGS="$S6 softmax" T=80 bash scripts/gpu-zoo.sh tput
MIXZOO_ATTN_STRIDES=plain TPN=-softmax-plain TP_ARGS="$S6 softmax" T=80 bash scripts/gpu-zoo.sh tput
GTN=-attn-aligned KEXPR="aligned" K="tests/gpu/test_attn_gpu.py" T=60 bash scripts/gpu-zoo.sh gputests
for f in logs/throughput-softmax-*.md; do echo "== $f"; grep -E "stacked" $f | head -n 4; done
grep -h -E "passed|failed|^FAILED|attention B=" logs/gputests-attn-aligned.log | tail -n 8
for f in logs/throughput-lla-*-vec.md; do echo "== $f"; grep -E "stacked" $f | head -n 4; done
grep -h -E "passed|failed|^FAILED|lla B=" logs/gputests-strided-vec.log | tail -n 8
