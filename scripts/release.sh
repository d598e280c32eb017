#!/usr/bin/env bash
# Publishes a kiln release: the multi-arch image (linux/amd64 + linux/arm64, one image index)
# and the Helm chart, both to an OCI registry. What .github/workflows/release.yml runs on a tag.
#
#   scripts/release.sh [--registry REGISTRY/PATH] [--binary ARCH=FILE]... [--skip-image]
#
#   --registry R   where to push: the image as R/kiln:<version> (skopeo copy --all) and the
#                  chart as oci://R/charts/kiln:<version> (helm push). Without it nothing is
#                  pushed: the image archive and the chart package are left in target/release/
#                  and the push commands are printed (a dry run).
#   --binary A=F   a prebuilt kiln binary per architecture (amd64=…, arm64=…), passed to
#                  scripts/build-image.sh; default: its dist builds (arm64 cross-compiled).
#   --skip-image   package and check the chart only.
#
# The version is the workspace's (`kiln version --only version` of the built binary for the
# image; Cargo.toml's for the chart, which must agree with deploy/helm/kiln/Chart.yaml's
# version and appVersion). Needs root, buildah, Debian's cross toolchain (see
# scripts/build-image.sh), helm 3.8+ and, to push, skopeo and registry credentials in the
# environment (REGISTRY_AUTH_FILE for skopeo, `helm registry login` done beforehand).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[release %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

registry="" skip_image=false
binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="$2"; shift 2 ;;
    --binary) binaries+=(--binary "$2"); shift 2 ;;
    --skip-image) skip_image=true; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
helm=${HELM:-helm}
command -v "$helm" >/dev/null || helm=testcluster/bin/helm
[ -x "$(command -v "$helm")" ] || die "helm not found (set HELM)"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
chart=deploy/helm/kiln
chart_version=$(sed -n 's/^version: *//p' "$chart/Chart.yaml")
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$chart/Chart.yaml")
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] ||
  die "Chart.yaml version $chart_version / appVersion $app_version differ from the workspace's $version"
out=target/release-artifacts
mkdir -p "$out"

say "chart $version: lint (strict, with the schema) and package"
"$helm" lint --strict "$chart" >/dev/null
"$helm" package "$chart" --destination "$out" >/dev/null
package=$out/kiln-$version.tgz
[ -s "$package" ] || die "no $package"
# The packaged chart renders on its own (what users install from the registry).
"$helm" template kiln "$package" --namespace gpu-operator >/dev/null

archive=$out/kiln-$version-linux-amd64-arm64.oci.tar
if ! $skip_image; then
  say "image $version: linux/amd64 + linux/arm64"
  scripts/build-image.sh --platform linux/amd64,linux/arm64 "${binaries[@]}" --output "$archive"
fi

push_image="skopeo copy --all oci-archive:$archive docker://${registry:-REGISTRY}/kiln:$version"
push_chart="$helm push $package oci://${registry:-REGISTRY}/charts"
if [ -z "$registry" ]; then
  say "dry run (no --registry); would run:"
  $skip_image || echo "$push_image"
  echo "$push_chart"
  exit 0
fi
if ! $skip_image; then
  command -v skopeo >/dev/null || die "skopeo is not installed (apt-get install -y skopeo)"
  say "pushing the image"; $push_image
fi
say "pushing the chart"; $push_chart
say "released kiln $version to $registry"
