#!/usr/bin/env bash
# Builds kiln's OCI image (the operator and every kiln operand) as an OCI archive, without a
# container daemon or a registry: Debian's buildah (`apt-get install -y buildah`) with vfs
# storage and chroot isolation, `FROM scratch` (Containerfile), and a root filesystem made here
# from Debian packages plus the `kiln` binary.
#
#   scripts/build-image.sh [--binary FILE] [--output FILE.tar]
#
#   --binary FILE  the kiln binary to put in the image (default: `cargo build --profile dist -p
#                  kiln-cli` and target/dist/kiln: release with whole-program LTO, a smaller
#                  resident operator; about 20 min on 2 cores). Must be linux/amd64 (the only platform
#                  built for now) and link against glibc no newer than the packages' (2.36).
#   --output FILE  the OCI archive (default target/image/kiln-<version>-linux-amd64.oci.tar).
#
# The image name, tag and labels come from the binary (`kiln version --only …`), so they are
# the ones the chart and the operand fallbacks use (kiln_render::defaults::KILN_IMAGE). Load
# or push the archive with e.g. `skopeo copy oci-archive:FILE docker://REGISTRY/kiln:TAG`,
# `podman load -i FILE`, or `ctr -n k8s.io images import FILE` on a node.
# Needs root (we are, here and in CI): the root filesystem keeps its owners (65532's home).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[build-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

binary="" output=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

started=$(date +%s)
command -v buildah >/dev/null || die "buildah is not installed (apt-get install -y buildah)"
command -v dpkg-deb >/dev/null || die "dpkg-deb is not installed (a Debian/Ubuntu build machine is assumed)"
[ "$(id -u)" = 0 ] || die "run as root (the root filesystem keeps per-file owners)"
arch=$(dpkg --print-architecture)
[ "$arch" = amd64 ] || die "only linux/amd64 is built for now (this machine is $arch)"

if [ -z "$binary" ]; then
  say "building the shipped binary (cargo build --profile dist -p kiln-cli: release + fat LTO)"
  cargo build --profile dist --locked -p kiln-cli
  binary=target/dist/kiln
fi
[ -x "$binary" ] || die "$binary is not an executable"
version=$("$binary" version --only version)
image=$("$binary" version --only image)
revision=$("$binary" version --only commit)
source_url=$("$binary" version --only source)
output=${output:-target/image/kiln-$version-linux-$arch.oci.tar}
# Reproducible timestamps: the commit's time when known.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
say "image $image (revision $revision) from $binary"

mkdir -p target/image
work=$(mktemp -d "$PWD/target/image/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs

# Debian packages, cached in target/image/debs: glibc (the binary's loader and libc, and what
# dlopen of the host's libnvidia-ml.so.1 needs), libgcc (unwinding) and the CA bundle.
packages=(libc6 libgcc-s1 ca-certificates)
debs=target/image/debs
mkdir -p "$debs"
for p in "${packages[@]}"; do
  if ! ls "$debs/${p}_"*.deb >/dev/null 2>&1; then
    say "downloading $p"
    (cd "$debs" && apt-get download -q "$p" 2>/dev/null) ||
      { apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "$p"); } ||
      die "apt-get download $p failed"
  fi
done

# A merged-/usr layout (/bin, /lib, /lib64, /sbin link into /usr), as Debian's own images.
mkdir -p "$rootfs"/usr/{bin,lib,lib64,sbin} "$rootfs"/var/lib/dpkg/status.d
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$rootfs/$d"; done
for p in "${packages[@]}"; do
  deb=$(ls "$debs/${p}_"*.deb | sort | tail -1)
  say "unpacking $(basename "$deb")"
  dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "$rootfs"
  # What scanners read to list an image's packages (as distroless images record them).
  dpkg-deb -f "$deb" > "$rootfs/var/lib/dpkg/status.d/$p"
done
# Nothing at run time reads docs, locales or iconv modules.
rm -rf "$rootfs"/usr/share/{doc,lintian,man,locale,info} "$rootfs"/usr/lib/*-linux-gnu/gconv
# The CA bundle update-ca-certificates would make (a package's scripts do not run here).
mkdir -p "$rootfs/etc/ssl/certs"
find "$rootfs/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | xargs cat \
  > "$rootfs/etc/ssl/certs/ca-certificates.crt"
rm -rf "$rootfs/usr/share/ca-certificates" "$rootfs/usr/sbin/update-ca-certificates"
[ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || die "no CA certificates"

cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"
# The NVIDIA container runtime's ldconfig hook adds the driver's libraries through these.
printf 'include /etc/ld.so.conf.d/*.conf\n' > "$rootfs/etc/ld.so.conf"
mkdir -p "$rootfs"/{root,tmp,home/nonroot,etc/kiln/plugins}
chmod 0700 "$rootfs/root" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"
chown -R 0:0 "$rootfs"
chown 65532:65532 "$rootfs/home/nonroot"

# The binary, without debug sections (symbols stay, for backtraces).
install -m 0755 "$binary" "$rootfs/usr/bin/kiln"
if command -v strip >/dev/null; then strip --strip-debug "$rootfs/usr/bin/kiln"; fi
chroot "$rootfs" /usr/bin/kiln version --only version >/dev/null ||
  die "the binary does not run on the image's glibc"

mkdir -p "$work/context"
tar -C "$rootfs" --sort=name --numeric-owner --mtime="@$epoch" -cf "$work/context/rootfs.tar" .
say "root filesystem: $(du -sh "$rootfs" | cut -f1)"

store=(--root "$work/storage/root" --runroot "$work/storage/run" --storage-driver vfs)
buildah "${store[@]}" build --quiet --isolation chroot --timestamp "$epoch" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --build-arg SOURCE="$source_url" --build-arg CREATED="$created" \
  -f Containerfile -t "$image" "$work/context" >/dev/null
mkdir -p "$(dirname "$output")"
rm -f "$output"
buildah "${store[@]}" push --quiet "$image" "oci-archive:$output:$image"
say "wrote $output ($(du -h "$output" | cut -f1), $image) in $(( $(date +%s) - started )) s"
