# planned, not run on 2026-12-06 (session c: every call was lent an H100 and the device time ran out): the eight with
# the current defaults on an H200, K = 6, the floor and K = 3, as benchmarks/calls-2026-12-06c/call2.sh, to replace the
# README's H200 table (commit 51ec073). Run it on an H200: BUDGET=575 bash benchmarks/calls-2026-12-06c/call2.sh
bash benchmarks/calls-2026-12-06c/call2.sh
