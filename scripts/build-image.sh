#!/usr/bin/env bash
# Builds kiln's OCI image (the operator and every kiln operand) as an OCI archive, without a
# container daemon or a registry: Debian's buildah (`apt-get install -y buildah`) with vfs
# storage and chroot isolation, `FROM scratch` (Containerfile), and a root filesystem made here
# from Debian packages plus the `kiln` binary. One platform gives one image manifest; several
# give one image index over them (a multi-arch image: linux/amd64 and linux/arm64).
#
#   scripts/build-image.sh [--platform linux/amd64[,linux/arm64]] [--binary [ARCH=]FILE]...
#                          [--profile dist|dev] [--output FILE.tar]
#
#   --platform P   linux/amd64 (default: this machine's) and/or linux/arm64, comma-separated.
#                  arm64 is cross-compiled on an amd64 machine: `rustup target add
#                  aarch64-unknown-linux-gnu`, Debian's gcc-aarch64-linux-gnu and, to run the
#                  binary once before packing it, qemu-user; its Debian packages are downloaded
#                  as foreign-architecture packages (`dpkg --add-architecture arm64 && apt-get
#                  update` once). jemalloc is built for 64 KiB pages there (JEMALLOC_SYS_WITH_LG_PAGE
#                  =16: GH200/GB200 kernels use them; it also runs on 4 KiB pages). The cross build
#                  goes to target/cross (its own cargo target directory, so that a build started
#                  from a running `cargo test`, the image test, never waits on the test's lock).
#   --binary FILE  the kiln binary to put in the image; with several platforms, `ARCH=FILE` per
#                  platform (amd64=…, arm64=…). Default: `cargo build --profile dist -p kiln-cli
#                  --target <triple>` (release with whole-program LTO; about 20 min on 2 cores
#                  per platform). It must link against glibc no newer than the packages' (2.36).
#   --profile P    the cargo profile of the binaries built here: dist (default, shipped) or dev
#                  (what the image test uses: minutes, not tens of minutes, for arm64 on 2 cores).
#   --output FILE  the OCI archive (default target/image/kiln-<version>-linux-<arch>[-<arch>].oci.tar).
#
# The image name, tag and labels come from the binary (`kiln version --only …`), so they are
# the ones the chart and the operand fallbacks use (kiln_render::defaults::KILN_IMAGE). Load
# or push the archive with e.g. `skopeo copy --all oci-archive:FILE docker://REGISTRY/kiln:TAG`,
# `podman load -i FILE`, or `ctr -n k8s.io images import FILE` on a node.
# Needs root (we are, here and in CI): the root filesystem keeps its owners (65532's home).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[build-image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "error: $*"; exit 1; }

platforms="" output="" profile=dist
declare -A binaries=()
while [ $# -gt 0 ]; do
  case "$1" in
    --platform) platforms="$2"; shift 2 ;;
    --binary)
      case "$2" in
        amd64=*|arm64=*) binaries[${2%%=*}]="${2#*=}" ;;
        *) binaries[any]="$2" ;;
      esac
      shift 2 ;;
    --output) output="$2"; shift 2 ;;
    --profile) profile="$2"; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

started=$(date +%s)
command -v buildah >/dev/null || die "buildah is not installed (apt-get install -y buildah)"
command -v dpkg-deb >/dev/null || die "dpkg-deb is not installed (a Debian/Ubuntu build machine is assumed)"
[ "$(id -u)" = 0 ] || die "run as root (the root filesystem keeps per-file owners)"
host_arch=$(dpkg --print-architecture)
[ "$host_arch" = amd64 ] || die "the build machine must be amd64 (this one is $host_arch); it cross-builds arm64"
archs=()
IFS=, read -r -a wanted <<< "${platforms:-linux/$host_arch}"
for p in "${wanted[@]}"; do
  case "$p" in
    linux/amd64) archs+=(amd64) ;;
    linux/arm64) archs+=(arm64) ;;
    *) die "unsupported platform $p (linux/amd64, linux/arm64)" ;;
  esac
done
[ -n "${binaries[any]:-}" ] && [ ${#archs[@]} -gt 1 ] && die "with several platforms, name each binary: --binary ARCH=FILE"
case "$profile" in dist|dev) ;; *) die "unsupported profile $profile (dist, dev)" ;; esac
triple() { case "$1" in amd64) echo x86_64-unknown-linux-gnu ;; arm64) echo aarch64-unknown-linux-gnu ;; esac; }
# cargo's output directory of a profile (`dev` builds into `debug`).
profile_dir() { [ "$profile" = dev ] && echo debug || echo "$profile"; }

# The cross build's environment, in this one place: Debian's cross gcc as linker and C compiler
# (jemalloc and ring compile C), and jemalloc for 64 KiB pages (lg 16: the largest page size an
# arm64 kernel may use; GH200/GB200 systems run 64 KiB kernels, and jemalloc built for 4 KiB
# pages fails there with "Unsupported system page size"). A larger lg page costs a little
# memory on 4 KiB kernels and nothing else.
cross_build_arm64() {
  command -v aarch64-linux-gnu-gcc >/dev/null ||
    die "no aarch64 cross compiler (apt-get install -y gcc-aarch64-linux-gnu)"
  rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu ||
    die "no Rust target aarch64-unknown-linux-gnu (rustup target add aarch64-unknown-linux-gnu)"
  CARGO_TARGET_DIR="$PWD/target/cross" \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
  JEMALLOC_SYS_WITH_LG_PAGE=16 \
    cargo build --profile "$profile" --locked -p kiln-cli --target aarch64-unknown-linux-gnu
}

# The binary of each platform: given, or a dist build (cross-compiled for arm64).
declare -A bin=()
for arch in "${archs[@]}"; do
  b=${binaries[$arch]:-${binaries[any]:-}}
  if [ -z "$b" ]; then
    t=$(triple "$arch")
    say "building kiln for linux/$arch (cargo build --profile $profile --target $t)"
    local_started=$(date +%s)
    if [ "$arch" = arm64 ]; then
      cross_build_arm64
      b=target/cross/$t/$(profile_dir)/kiln
    else
      cargo build --profile "$profile" --locked -p kiln-cli
      b=target/$(profile_dir)/kiln
    fi
    say "built $b in $(( $(date +%s) - local_started )) s"
  fi
  [ -x "$b" ] || die "$b is not an executable"
  file_arch=$(od -An -tx1 -j18 -N2 "$b" | tr -d ' ')   # ELF e_machine: 3e00 x86-64, b700 aarch64
  case "$arch:$file_arch" in
    amd64:3e00|arm64:b700) ;;
    *) die "$b is not a linux/$arch binary (ELF machine $file_arch)" ;;
  esac
  bin[$arch]=$b
done

# `kiln` of one platform run inside its root filesystem: chroot for this machine's
# architecture, qemu-user for the other (no binfmt registration needed).
run_kiln() {
  local arch=$1 rootfs=$2; shift 2
  if [ "$arch" = "$host_arch" ]; then
    chroot "$rootfs" /usr/bin/kiln "$@"
  else
    command -v qemu-aarch64 >/dev/null || die "qemu-user is not installed (apt-get install -y qemu-user), needed to run the arm64 binary"
    qemu-aarch64 -L "$rootfs" "$rootfs/usr/bin/kiln" "$@"
  fi
}

mkdir -p target/image
work=$(mktemp -d "$PWD/target/image/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
store=(--root "$work/storage/root" --runroot "$work/storage/run" --storage-driver vfs)

# One root filesystem and image per platform.
build_platform() {
local arch=$1 binary=${bin[$1]}
local rootfs=$work/rootfs-$arch
# Debian packages, cached in target/image/debs: glibc (the binary's loader and libc, and what
# dlopen of the host's libnvidia-ml.so.1 needs), libgcc (unwinding) and the CA bundle.
packages=(libc6 libgcc-s1 ca-certificates)
local debs=target/image/debs/$arch
mkdir -p "$debs"
for p in "${packages[@]}"; do
  local spec=$p
  [ "$p" = ca-certificates ] || spec=$p:$arch
  if ! ls "$debs/${p}_"*.deb >/dev/null 2>&1; then
    say "downloading $spec"
    (cd "$debs" && apt-get download -q "$spec" 2>/dev/null) ||
      { apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "$spec"); } ||
      die "apt-get download $spec failed (for arm64: dpkg --add-architecture arm64 && apt-get update)"
  fi
done

# A merged-/usr layout (/bin, /lib, /lib64, /sbin link into /usr), as Debian's own images.
mkdir -p "$rootfs"/usr/{bin,lib,lib64,sbin} "$rootfs"/var/lib/dpkg/status.d
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$rootfs/$d"; done
for p in "${packages[@]}"; do
  local deb
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
local strip=strip
[ "$arch" = "$host_arch" ] || strip=aarch64-linux-gnu-strip
if command -v "$strip" >/dev/null; then "$strip" --strip-debug "$rootfs/usr/bin/kiln"; fi
local v
v=$(run_kiln "$arch" "$rootfs" version --only version) ||
  die "the linux/$arch binary does not run on the image's glibc"
if [ -z "$version" ]; then
  version=$v
  image=$(run_kiln "$arch" "$rootfs" version --only image)
  revision=$(run_kiln "$arch" "$rootfs" version --only commit)
  source_url=$(run_kiln "$arch" "$rootfs" version --only source)
  say "image $image (revision $revision)"
fi
[ "$v" = "$version" ] || die "the linux/$arch binary is version $v, not $version"

mkdir -p "$work/context-$arch"
tar -C "$rootfs" --sort=name --numeric-owner --mtime="@$epoch" -cf "$work/context-$arch/rootfs.tar" .
say "linux/$arch root filesystem: $(du -sh "$rootfs" | cut -f1)"

local into=(-t "$image")
[ ${#archs[@]} -gt 1 ] && into=(--manifest "$image")
buildah "${store[@]}" build --quiet --isolation chroot --timestamp "$epoch" --platform "linux/$arch" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --build-arg SOURCE="$source_url" --build-arg CREATED="$created" \
  -f Containerfile "${into[@]}" "$work/context-$arch" >/dev/null
}

# Reproducible timestamps: the commit's time when known.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
version="" image="" revision="" source_url=""
for arch in "${archs[@]}"; do build_platform "$arch"; done

output=${output:-target/image/kiln-$version-linux-$(IFS=-; echo "${archs[*]}").oci.tar}
mkdir -p "$(dirname "$output")"
rm -f "$output"
if [ ${#archs[@]} -gt 1 ]; then
  buildah "${store[@]}" manifest push --quiet --all "$image" "oci-archive:$output:$image"
else
  buildah "${store[@]}" push --quiet "$image" "oci-archive:$output:$image"
fi
say "wrote $output ($(du -h "$output" | cut -f1), $image, ${archs[*]}) in $(( $(date +%s) - started )) s"
