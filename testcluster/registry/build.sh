#!/usr/bin/env bash
# Builds testcluster/registry/bin/registry: go-containerregistry's in-memory OCI registry
# (`cmd/registry`, Distribution API v2), which the plugin distribution tests
# (host/plugin-oci/tests/registry.rs) start on a loopback port.
#
#   testcluster/registry/build.sh [--force]
#
# `go install MODULE@VERSION` builds it in its own module graph from the Go module proxy,
# with the ordinary Go caches; skipped when the binary of this version exists.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PATH="$PATH:/usr/local/go/bin"
export CGO_ENABLED=0
module=github.com/google/go-containerregistry/cmd/registry
version=v0.22.1
bin="$here/bin/registry"
stamp="$here/bin/.stamp"
if [[ "${1:-}" != "--force" && -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  echo "up to date: $bin ($version)"
  exit 0
fi
command -v go >/dev/null || { echo "error: go not found" >&2; exit 1; }
mkdir -p "$here/bin"
rm -f "$stamp"
GOBIN="$here/bin" go install -trimpath -buildvcs=false -ldflags "-s -w" "$module@$version"
echo "$version" > "$stamp"
echo "built $bin ($version, $(du -h "$bin" | cut -f1))"
