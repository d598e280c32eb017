#!/usr/bin/env bash
# Builds testcluster/bin/testcluster (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kwok from upstream Go modules, in one multicall binary).
#
#   testcluster/build.sh [--force]
#
# Also builds testcluster/bin/helm from helm.sh/helm/v3 (for chart tests; about 3 min
# cold, seconds warm); TESTCLUSTER_HELM=0 skips it.
#
# Uses the ordinary Go caches (GOCACHE, GOMODCACHE), so a rebuild after the
# first is quick, and skips the build entirely when the sources, go.mod/go.sum,
# this script and the Go version are unchanged and the binary exists.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export PATH="$PATH:/usr/local/go/bin"
export CGO_ENABLED=0
helm_version=v3.22.0
build_helm="${TESTCLUSTER_HELM:-1}"
force=0
[[ "${1:-}" == "--force" ]] && force=1

t0=$(date +%s)
say() { printf '[build.sh %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - t0 ))" "$*"; }

command -v go >/dev/null || { say "error: go not found (need Go >= 1.26)"; exit 1; }
bin="$here/bin/testcluster"
stamp="$here/bin/.stamp"
sum="$( { go version; cat go.mod go.sum build.sh; cat ./*.go; } | sha256sum | cut -d' ' -f1)"
if [[ $force == 0 && -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$sum" \
      && ( "$build_helm" == 0 || -x "$here/bin/helm" ) ]]; then
  say "up to date: $bin"
  exit 0
fi

say "$(go version); GOCACHE=$(go env GOCACHE) GOMODCACHE=$(go env GOMODCACHE)"
say "downloading modules"
go mod download
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"   # e.g. v1.36.3
major="${kver#v}"; major="${major%%.*}"
minor="${kver#v*.}"; minor="${minor%%.*}"
cbv=k8s.io/component-base/version
cgv=k8s.io/client-go/pkg/version
ldflags="-s -w"
for pkg in $cbv $cgv; do
  ldflags+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

total="$(go list -deps . | wc -l)"
say "compiling kubernetes $kver ($total packages; a cold build takes minutes, cached packages are not listed)"
mkdir -p "$here/bin"
rm -f "$stamp"
n=0
# `go build -v` names each package as it is compiled: turn that into progress lines.
if ! go build -v -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin.tmp" . 2>&1 | while IFS= read -r line; do
  if [[ "$line" =~ ^[a-zA-Z0-9._/~-]+$ ]]; then
    n=$((n + 1))
    if (( n % 100 == 0 )); then say "compiled $n packages (of at most $total), last: $line"; fi
  else
    printf '%s\n' "$line"
  fi
done; then
  say "error: go build failed"
  exit 1
fi
mv "$bin.tmp" "$bin"
say "built $bin ($(du -h "$bin" | cut -f1))"

if [[ "$build_helm" != 0 ]]; then
  say "building helm $helm_version (helm.sh/helm/v3/cmd/helm, its own module graph)"
  hv=helm.sh/helm/v3/internal/version
  GOBIN="$here/bin" go install -trimpath -buildvcs=false \
    -ldflags "-s -w -X $hv.version=$helm_version -X $hv.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$helm_version"
  say "built $here/bin/helm ($("$here/bin/helm" version --short))"
fi
echo "$sum" > "$stamp"
say "done in $(( $(date +%s) - t0 ))s"
