# planned, not run on 2026-12-06 (session c: every call was lent an H100 and the device time ran out): the eight with
# the current defaults on an H200, K = 6, the floor, then K = 3, as call2.sh ran them on the H100 (its last part, GLA's
# unpadded try, is refused by fla and only runs with time to spare), to replace the README's H200 table (commit
# 51ec073). Then: mixzoo bench throughput --project <the K = 6 and K = 3 JSON> --protocol settings
BUDGET=${BUDGET:-575} bash benchmarks/calls-2026-12-06c/call2.sh
