#!/usr/bin/env bash
# Real-GPU check for `kiln exporter`: starts it on NVML, scrapes /metrics, and compares its values
# with `nvidia-smi --query-gpu` for every GPU. Run on a machine with an NVIDIA GPU and driver:
#
#   cargo build --release -p kiln-cli && scripts/exporter-gpu-check.sh
#
# KILN (default target/release/kiln) picks the binary, PORT (default 19400) the port. Prints one
# line per GPU and field (kiln value, nvidia-smi value, tolerance, ok/DIFF) and exits 1 on any
# DIFF. Readings that change between the two reads (power, clocks, utilisation) get tolerances.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-target/release/kiln}
PORT=${PORT:-19400}
BACKEND=${BACKEND:-nvml} # `fake:<fixture>` only to test this script itself
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: not a GPU machine" >&2; exit 2; }
[ -x "$KILN" ] || { echo "$KILN not built (cargo build --release -p kiln-cli)" >&2; exit 2; }

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
# dcgm-exporter's own list (the GPU Operator's), with its commented-out rows switched on: every
# field kiln serves (violations, ECC, retired pages, NVLink, board strings, GPM ratios).
sed 's/^# \(DCGM_\)/\1/' host/exporter/tests/data/dcp-metrics-included.csv >"$work/metrics.csv"
KILN_LOG=warn "$KILN" exporter --gpu-backend "$BACKEND" -f "$work/metrics.csv" -a "127.0.0.1:$PORT" -c 1000 --node-name gpu-check \
  2>"$work/exporter.log" &
pid=$!
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
sleep 2 # let a poll run after the GPUs settled
curl -sf "http://127.0.0.1:$PORT/metrics" >"$work/metrics"
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,temperature.gpu,power.draw,memory.used,memory.free,clocks.sm,clocks.mem,utilization.gpu \
  --format=csv,noheader,nounits >"$work/smi"
# The readings the full list added (issue 36), one line per GPU in index order; Yes/No as 1/0.
nvidia-smi --query-gpu=index,temperature.memory,serial,vbios_version,inforom.img,inforom.oem,inforom.ecc,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.uncorrected.aggregate.total,retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,retired_pages.pending,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.failure \
  --format=csv,noheader,nounits | sed 's/\bYes\b/1/g; s/\bNo\b/0/g' >"$work/smi2"

echo "kiln: $("$KILN" --version)   driver: $(head -1 "$work/smi" | cut -d, -f5 | tr -d ' ')"
echo "start-up warnings:"; sed 's/^/  /' "$work/exporter.log" | head -20
# value of METRIC for gpu=IDX; empty (skipped) when absent or when the GPU has MIG on, where
# framebuffer fields come per MIG device (GPU_I_PROFILE/mig_device_uuid labels), not per GPU
val() { awk -v m="$1" -v g="gpu=\"$2\"" 'index($0, m"{")==1 && index($0, g) {
          if (index($0, "mig_device_uuid=")) { mig=1 } else if (v == "") { v=$NF } }
        END { if (!mig) print v }' "$work/metrics"; }
label() { grep -m1 "^$1{gpu=\"$2\"" "$work/metrics" | sed -n "s/.*[{,]$3=\"\([^\"]*\)\".*/\1/p"; }

fail=0
check() { # gpu field kiln smi tolerance(absolute)
  local ok
  ok=$(awk -v a="$3" -v b="$4" -v t="$5" 'BEGIN { if (a=="" || b=="" || b ~ /N\/A|Not/) { print "skip"; exit }
        d=a-b; if (d<0) d=-d; print (d<=t) ? "ok" : "DIFF" }')
  printf '  GPU %s %-28s kiln %-14s smi %-14s tol %-6s %s\n' "$1" "$2" "${3:--}" "${4:--}" "$5" "$ok"
  [ "$ok" = DIFF ] && fail=1 || true
}
check_str() { # gpu field kiln smi
  local ok=ok; [ "$3" = "$4" ] || { ok=DIFF; fail=1; }
  printf '  GPU %s %-28s kiln %-40s smi %-40s %s\n' "$1" "$2" "$3" "$4" "$ok"
}

while IFS=, read -r idx uuid name bus driver temp power used free sm mem util; do
  idx=$(echo "$idx" | tr -d ' '); trim() { echo "$1" | sed 's/^ *//;s/ *$//'; }
  echo "GPU $idx"
  check_str "$idx" UUID "$(label DCGM_FI_DEV_GPU_TEMP "$idx" UUID)" "$(trim "$uuid")"
  check_str "$idx" modelName "$(label DCGM_FI_DEV_GPU_TEMP "$idx" modelName)" "$(trim "$name")"
  check_str "$idx" pci_bus_id "$(label DCGM_FI_DEV_GPU_TEMP "$idx" pci_bus_id)" "$(trim "$bus")"
  check_str "$idx" DCGM_FI_DRIVER_VERSION "$(label DCGM_FI_DEV_GPU_TEMP "$idx" DCGM_FI_DRIVER_VERSION)" "$(trim "$driver")"
  check "$idx" DCGM_FI_DEV_GPU_TEMP "$(val DCGM_FI_DEV_GPU_TEMP "$idx")" "$(trim "$temp")" 3
  check "$idx" DCGM_FI_DEV_POWER_USAGE "$(val DCGM_FI_DEV_POWER_USAGE "$idx")" "$(trim "$power")" 25
  check "$idx" DCGM_FI_DEV_FB_USED "$(val DCGM_FI_DEV_FB_USED "$idx")" "$(trim "$used")" 64
  check "$idx" DCGM_FI_DEV_FB_FREE "$(val DCGM_FI_DEV_FB_FREE "$idx")" "$(trim "$free")" 64
  check "$idx" DCGM_FI_DEV_SM_CLOCK "$(val DCGM_FI_DEV_SM_CLOCK "$idx")" "$(trim "$sm")" 300
  check "$idx" DCGM_FI_DEV_MEM_CLOCK "$(val DCGM_FI_DEV_MEM_CLOCK "$idx")" "$(trim "$mem")" 300
  check "$idx" DCGM_FI_DEV_GPU_UTIL "$(val DCGM_FI_DEV_GPU_UTIL "$idx")" "$(trim "$util")" 20
done <"$work/smi"

while IFS=, read -r idx memtemp serial vbios img oem ecc sbev dbev sbea dbea rsbe rdbe rpend rcor runc rfail; do
  idx=$(echo "$idx" | tr -d ' '); trim() { echo "$1" | sed 's/^ *//;s/ *$//'; }
  echo "GPU $idx (fields of the full list)"
  [ "$(trim "$serial")" = "[N/A]" ] || check_str "$idx" DCGM_FI_DEV_SERIAL "$(label DCGM_FI_DEV_GPU_TEMP "$idx" DCGM_FI_DEV_SERIAL)" "$(trim "$serial")"
  check_str "$idx" DCGM_FI_DEV_VBIOS_VERSION "$(label DCGM_FI_DEV_GPU_TEMP "$idx" DCGM_FI_DEV_VBIOS_VERSION)" "$(trim "$vbios")"
  check_str "$idx" DCGM_FI_DEV_INFOROM_IMAGE_VER "$(label DCGM_FI_DEV_GPU_TEMP "$idx" DCGM_FI_DEV_INFOROM_IMAGE_VER)" "$(trim "$img")"
  check "$idx" DCGM_FI_DEV_MEMORY_TEMP "$(val DCGM_FI_DEV_MEMORY_TEMP "$idx")" "$(trim "$memtemp")" 3
  check "$idx" DCGM_FI_DEV_ECC_SBE_VOL_TOTAL "$(val DCGM_FI_DEV_ECC_SBE_VOL_TOTAL "$idx")" "$(trim "$sbev")" 0
  check "$idx" DCGM_FI_DEV_ECC_DBE_VOL_TOTAL "$(val DCGM_FI_DEV_ECC_DBE_VOL_TOTAL "$idx")" "$(trim "$dbev")" 0
  check "$idx" DCGM_FI_DEV_ECC_SBE_AGG_TOTAL "$(val DCGM_FI_DEV_ECC_SBE_AGG_TOTAL "$idx")" "$(trim "$sbea")" 0
  check "$idx" DCGM_FI_DEV_ECC_DBE_AGG_TOTAL "$(val DCGM_FI_DEV_ECC_DBE_AGG_TOTAL "$idx")" "$(trim "$dbea")" 0
  check "$idx" DCGM_FI_DEV_RETIRED_SBE "$(val DCGM_FI_DEV_RETIRED_SBE "$idx")" "$(trim "$rsbe")" 0
  check "$idx" DCGM_FI_DEV_RETIRED_DBE "$(val DCGM_FI_DEV_RETIRED_DBE "$idx")" "$(trim "$rdbe")" 0
  check "$idx" DCGM_FI_DEV_RETIRED_PENDING "$(val DCGM_FI_DEV_RETIRED_PENDING "$idx")" "$(trim "$rpend")" 0
  check "$idx" DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS "$(val DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS "$idx")" "$(trim "$rcor")" 0
  check "$idx" DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS "$(val DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS "$idx")" "$(trim "$runc")" 0
  check "$idx" DCGM_FI_DEV_ROW_REMAP_FAILURE "$(val DCGM_FI_DEV_ROW_REMAP_FAILURE "$idx")" "$(trim "$rfail")" 0
  # No nvidia-smi counterpart: printed for the note (GPM ratios need Hopper; two polls).
  for m in DCGM_FI_PROF_GR_ENGINE_ACTIVE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE DCGM_FI_PROF_DRAM_ACTIVE \
           DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL DCGM_FI_DEV_POWER_VIOLATION DCGM_FI_DEV_THERMAL_VIOLATION; do
    printf '  GPU %s %-40s kiln %s\n' "$idx" "$m" "$(val "$m" "$idx")"
  done
done <"$work/smi2"

[ "$fail" = 0 ] && echo "RESULT: kiln matches nvidia-smi" || echo "RESULT: differences found"
exit "$fail"
