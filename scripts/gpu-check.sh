#!/usr/bin/env bash
# Real-GPU check: on a machine with an NVIDIA GPU and driver (and Rust), build `kiln`, run GFD
# once (labels on stdout), the validator's driver and cuda steps against the real root (the cuda
# step creates a CUDA context on every GPU and copies 16 MiB there and back through
# libcuda.so.1), and print UUIDs, memory and driver version. Needs no cluster; a few minutes,
# build included.
#
#   scripts/gpu-check.sh            # from anywhere; runs in the repository root
#
# Without a GPU it stops at the first NVML use with the typed error ("NVML init failed: …"),
# exit status 1. Other agents may append their own delimited sections before the last line.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Checks that failed without stopping the script (reported at the end).
failed=""

echo "== build (release, kiln-cli)"
cargo build --release -p kiln-cli 2>&1 | tail -n 3
kiln=target/release/kiln

echo "== host"
if [ -r /proc/driver/nvidia/version ]; then
  head -n 1 /proc/driver/nvidia/version
else
  echo "no /proc/driver/nvidia/version (no NVIDIA kernel module loaded)"
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv || true
fi

# ---- validator / GFD (kiln-validator, kiln-gfd) ----
echo "== kiln gfd --oneshot --output stdout (default config)"
# No --config-file: a file named there must exist; the default path, absent, means the default
# config (as upstream).
env -u CONFIG_FILE -u GFD_CONFIG_FILE "$kiln" gfd --oneshot --output stdout

echo "== kiln gfd, time-slicing replicas 5"
printf 'version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 5\n' \
  >"$work/ts.yaml"
"$kiln" gfd --oneshot --no-timestamp --output stdout --config-file "$work/ts.yaml" |
  grep -E 'gpu\.(product|replicas|sharing-strategy|count|memory)='

echo "== kiln validator driver (host root /, status files in $work/validations)"
# 3 attempts 1 s apart: a working driver answers at once, a broken one fails fast.
"$kiln" validator --host-root / --validations-dir "$work/validations" \
  --retries 3 --sleep-interval-seconds 1 driver
echo "-- driver-ready:"
cat "$work/validations/driver-ready"
echo "-- CUDA unified-memory device nodes (the driver step creates them when missing):"
ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools || true

echo "== kiln validator cuda (every CUDA device: a context, 16 MiB written and read back)"
# libcuda.so.1 comes from the host's loader cache here (in a pod, the container runtime injects
# it). A failure names the device and the CUDA call (or the missing library); the other checks
# still run, and the script exits 1 at the end.
started=$(date +%s%N)
cuda_rc=0
"$kiln" validator --validations-dir "$work/validations" --retries 1 cuda || cuda_rc=$?
echo "-- exit status $cuda_rc after $(( ($(date +%s%N) - started) / 1000000 )) ms; cuda-ready $(
  [ -e "$work/validations/cuda-ready" ] && echo written || echo absent)"
if command -v nvidia-smi >/dev/null; then
  echo "-- nvidia-smi lists $(nvidia-smi -L | grep -c '^GPU ') GPU(s); the step names each CUDA device it checked"
fi
[ "$cuda_rc" -eq 0 ] || failed="$failed cuda"
# ---- end validator / GFD ----

# ---- device plugin (kiln-device-plugin) ----
echo "== kiln device-plugin on NVML against the kubelet stand-in (time-slicing x5)"
# The bench binary starts the kubelet stand-in, runs target/release/kiln device-plugin on real
# NVML, prints the registered units (UUID::k), an Allocate response, Allocate p99 and VmRSS.
KILN_BIN="$PWD/$kiln" KILN_DP_GPU_BACKEND=nvml \
  cargo bench -p kiln-device-plugin --bench plugin 2>&1 | grep -E '^process'
# ---- end device plugin ----

if [ -n "$failed" ]; then
  echo "== gpu-check FAILED:$failed"
  exit 1
fi
echo "== gpu-check OK"
