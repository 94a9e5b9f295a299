#!/usr/bin/env bash
# The loss of the lossy wires (docs/results.md "Loss of the low-bit wires"): DiLoCo at H 10 (outer momentum 0.7)
# and the default rule, each in FP32 and in every lossy wire with and without error feedback, regimes A (iid)
# and B (noniid), seeds 0-4, on the frontier harness. Resumable: a finished run is skipped, several copies share
# the work through lock files. Report: python benchmarks/campaigns/wire_loss_report.py
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/wire_loss}
SEEDS=${SEEDS:-0,1,2,3,4}
# name suffix -> AutoLoCoConfig fields of the wire
WIRES=(
  "fp32:wire_dtype=fp32"
  "int4_ef:wire_dtype=int4,error_feedback=true"
  "fp4_ef:wire_dtype=fp4,error_feedback=true"
  "int2_ef:wire_dtype=int2,error_feedback=true"
  "int2_top2_ef:wire_dtype=int2,topk_fraction=0.02,error_feedback=true"
  "int4:wire_dtype=int4"
  "int2:wire_dtype=int2"
  "int2_top2:wire_dtype=int2,topk_fraction=0.02"
)
METHODS=(
  "diloco_mu0.7_h10:method=diloco,outer_momentum=0.7"
  "default:method=autoloco_descent"
)
for method in "${METHODS[@]}"; do
  specs=()
  for wire in "${WIRES[@]}"; do
    specs+=(--adaptive "${method%%:*}__${wire%%:*}:${method#*:},${wire#*:}")
  done
  python benchmarks/campaigns/frontier.py --out "$OUT" --regimes iid,noniid --seeds "$SEEDS" \
    --h-list '' --mu-list '' --quiet --no-report "${specs[@]}"
done
