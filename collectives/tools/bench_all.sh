#!/usr/bin/env bash
# Every benchmark on the N GPUs of this machine, in one call, each under a time bound, every
# figure written as JSON named after the machine into $OUT (default /tmp/ptxops-bench):
#   bash collectives/tools/bench_all.sh [N]          N: GPUs (default: every visible one)
#   bench-<device>.json (+ .png)  collectives.tools.bench --dtypes bf16: barrier, all-reduce,
#                                 reduce-scatter, all-gather; eager and graphs; ours plain and
#                                 symmetric; NCCL plain / symmetric windows / copy engines; torch symm_mem
#   gemm-overlap-<device>.json    collectives.tools.gemm_overlap_bench: the GEMM alone, ours at every
#                                 setting below, torch.mm + NCCL, torch's fused ops
#   moe-<device>.json             collectives.tools.all_to_all_bench --fp8 (all-to-all, MoE layer, fp8)
#   moe-symm-mem-<device>.json    collectives.tools.all_to_all_bench --symm-mem (torch's NVSHMEM all-to-all)
#   overlap-timeline-<device>.json  collectives.tools.overlap_timeline at M = N = K = 4096 (where torch's
#                                 fused all-gather GEMM hides its communication and ours does not),
#                                 with the copy-engine gather beside the kernel's (+ .png)
#   <bench>.log                   each bench's output
# <device>: 4xH200 (collectives.tools.records.device_tag).  Bounds (seconds; SIGINT first, so a
# bench cut short still writes what it measured, then SIGKILL 20 s later): BENCH_S=180,
# GEMM_S=80, MOE_S=60, SYMM_S=20, TIMELINE_S=30: about 6 minutes in all.  Then, on any machine:
#   cp $OUT/*.json docs/data/ && python -m collectives.tools.bench_report docs/data --device 4xH200 \
#       --write docs/benchmarks.md
# NVLink multicast stays off (the NVLS-off variables are set here and by every bench).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
n="${1:-$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)}"
if [[ $n -lt 2 ]]; then
    echo "bench_all: needs 2 GPUs or more (found $n)" >&2
    exit 1
fi
out="${OUT:-/tmp/ptxops-bench}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0

# bench NAME SECONDS MODULE ARGS...: torchrun of MODULE on n GPUs under the bound, its log $out/NAME.log
bench() {
    local name="$1" seconds="$2" module="$3"; shift 3
    local start=$SECONDS
    timeout -s INT -k 20 "$seconds" torchrun --nproc-per-node "$n" -m "$module" --out "$out" "$@" \
        >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s; $(grep -c 'skipped' "$out/$name.log") skipped-column line(s); $(grep '^wrote' "$out/$name.log" | tail -n 1)"
    [[ $rc -eq 0 ]] || status=1
}
bench bench "${BENCH_S:-180}" collectives.tools.bench --dtypes bf16
bench gemm-overlap "${GEMM_S:-80}" collectives.tools.gemm_overlap_bench \
    --comm-priority 0,-1
bench moe "${MOE_S:-60}" collectives.tools.all_to_all_bench --fp8
bench moe-symm-mem "${SYMM_S:-20}" collectives.tools.all_to_all_bench --symm-mem
bench overlap-timeline "${TIMELINE_S:-30}" collectives.tools.overlap_timeline --shape 4096,4096,4096
ls -l "$out"/*.json
exit $status
