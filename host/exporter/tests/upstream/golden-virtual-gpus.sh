#!/usr/bin/env bash
# Regenerates tests/data/golden-virtual-gpus.prom and tests/data/golden-mig-virtual-gpus.prom from
# dcgm-exporter's own code (not from kiln's): its PodMapper.Process in virtual-GPU mode and its
# text template, with kiln_golden_test.go's scene (the fixture's values, the pods of
# tests/exporter/virtual_gpus.rs) and kiln_golden_mig_test.go's (mig-virtual-gpus.yaml's GPU
# instances, the pods of tests/exporter/mig_virtual_gpus.rs), NVML and the pid → pod UID step
# answered from tables through the one seam in kiln_seam.go.
#
# usage: golden-virtual-gpus.sh DCGM_EXPORTER_CHECKOUT [GO_DCGM_CHECKOUT]
#   DCGM_EXPORTER_CHECKOUT: a scratch copy of github.com/NVIDIA/dcgm-exporter (it is edited),
#     at the commit named in tests/data/README.md
#   GO_DCGM_CHECKOUT: github.com/NVIDIA/go-dcgm at the version dcgm-exporter's go.mod pins, when
#     the Go module proxy does not serve it
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$1
tr=$src/internal/pkg/transformation
cp "$here/kiln_golden_test.go" "$here/kiln_golden_mig_test.go" "$here/kiln_seam.go" "$tr/"
sed -i 's/pidMapper: newPIDToPodMapper(),/pidMapper: kilnPIDMapper(),/' "$tr/kubernetes.go"
grep -q 'pidMapper: kilnPIDMapper(),' "$tr/kubernetes.go"
cd "$src"
if [ -n "${2:-}" ]; then go mod edit -replace "github.com/NVIDIA/go-dcgm=$2"; fi
KILN_GOLDEN_OUT="$here/../data/golden-virtual-gpus.prom" \
  KILN_GOLDEN_MIG_OUT="$here/../data/golden-mig-virtual-gpus.prom" \
  go test -count=1 -v -run '^TestKilnGolden(MIG)?$' ./internal/pkg/transformation
