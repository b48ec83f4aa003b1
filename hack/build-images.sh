#!/usr/bin/env bash
# Builds the operator's OCI images, and the etcd images its member pods run, without Docker:
# the one definition of each image (the Dockerfile is gone).
#
#   hack/build-images.sh              release binaries (cargo build --release), then every image
#   hack/build-images.sh --no-build   the images from the release binaries already built
#   IMAGES="controller webhook" hack/build-images.sh   only some images (names below)
#
# Images, each an OCI layout `target/images/oci/NAME` (tag = the image tag) and a
# docker-archive `target/images/NAME.tar` (for `ctr images import`, `kind load image-archive`,
# `skopeo copy docker-archive:...`):
#   controller  etcd-operator/etcd-controller:VERSION   the controller (also the restore steps)
#   webhook     etcd-operator/etcd-webhook:VERSION      the admission webhook
#   etcd-X.Y.Z  quay.io/coreos/etcd:vX.Y.Z              etcd, etcdctl (and etcdutl from 3.5) of
#                                                       every pinned line, from hack/build-tools.sh
#   pause       registry.k8s.io/pause:3.10              a node's pod sandbox: hack/pause/pause.c,
#                                                       static, alone in its image, as 65535
#   coredns     registry.k8s.io/coredns/coredns:vX.Y.Z  the real node's cluster DNS, from
#                                                       hack/build-tools.sh (hack/coredns), 65532
#
# The base of every image is a minimal glibc root filesystem from this machine's Debian
# packages (libc6, libgcc-s1, base-files, netbase, tzdata), CA certificates, `/etc/passwd` and
# `/etc/group` with `nonroot` (65532), `/tmp` (1777), and no shell. The operator's images run as
# 65532:65532; the etcd images as root, as upstream's do (the operator's member pods set their
# own user).
#
# Reproducible: every file's time is SOURCE_DATE_EPOCH (default: the last commit's time), owners
# are numeric, and the image configs carry no history, so two builds of the same tree on the
# same Debian package versions give the same digests. Needs umoci and skopeo (Debian packages;
# hack/check-prereqs.sh images checks).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
TOOLS="${ETCD_OPERATOR_TOOLS:-$HOME/.cache/etcd-operator/tools}"
OUT="${IMAGES_OUT:-$root/target/images}"
# The workspace's version (every crate inherits it: `version.workspace = true`).
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)"
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "build-images: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
# Not exported before the cargo build below: the `cc` crate's build scripts rerun when
# SOURCE_DATE_EPOCH changes, and a value the caller's `cargo build` did not see rebuilt ring and
# everything above it (3.5 min on the CI machine). A caller's exported value stays exported.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"

log() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

"$here/check-prereqs.sh" images

build=1
[[ "${1:-}" == "--no-build" ]] && build=0
all_etcd="$ETCD_SOURCE_VERSIONS $ETCD_VERSIONS"
images="${IMAGES:-controller webhook pause coredns $(for v in $all_etcd; do printf 'etcd-%s ' "$v"; done)}"

if ((build)) && [[ " $images " == *" controller "* || " $images " == *" webhook "* ]]; then
  log "cargo build --release (controller, webhook)"
  (cd "$root" && cargo build --release --locked -p etcd-controller --bin etcd-controller -p etcd-webhook --bin etcd-webhook)
fi
export SOURCE_DATE_EPOCH

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The base root filesystem, from the Debian packages apt has (the same versions as this
# machine runs: a binary built here finds its glibc there).
base="$work/base"
make_base() {
  mkdir -p "$base" "$work/debs"
  (cd "$work/debs" && apt-get download libc6 libgcc-s1 base-files netbase tzdata >/dev/null 2>&1) ||
    { log "apt-get download failed (run apt-get update first)"; exit 1; }
  for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$base"; done
  # Documentation, manuals, locales and the packages' own metadata have no use in an image.
  rm -rf "$base/usr/share/doc" "$base/usr/share/man" "$base/usr/share/info" "$base/usr/share/lintian" \
    "$base/usr/share/locale" "$base/usr/lib/x86_64-linux-gnu/gconv" "$base/etc/update-motd.d" \
    "$base/usr/share/common-licenses" "$base/usr/share/base-files" "$base/etc/dpkg"
  # No shell or tool a base-files script would want: the image runs one binary.
  find "$base" -name '*.sh' -path '*/etc/*' -delete
  mkdir -p "$base/etc/ssl/certs" "$base/tmp" "$base/home/nonroot" "$base/var/run"
  cp /etc/ssl/certs/ca-certificates.crt "$base/etc/ssl/certs/ca-certificates.crt"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$base/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$base/etc/group"
  printf 'hosts: files dns\n' > "$base/etc/nsswitch.conf"
  chmod 1777 "$base/tmp"
  chmod 0700 "$base/home/nonroot"
}
make_base

# assemble NAME REF USER ENTRYPOINT (JSON-less: one path) FILES...: the image NAME tagged REF
# from the base plus FILES (SRC:DEST pairs), with USER and ENTRYPOINT, and `--config.*` flags
# given in $config_flags (an array); with image_base= (empty), FILES alone.
assemble() {
  local name="$1" ref="$2" user="$3" entrypoint="$4"; shift 4
  local rootfs="$work/$name/rootfs" layout="$OUT/oci/$name" tag="${ref##*:}"
  rm -rf "$work/$name" "$layout" "$OUT/$name.tar"
  mkdir -p "$rootfs" "$OUT/oci"
  if [[ -n "${image_base-$base}" ]]; then
    cp -a "$base/." "$rootfs/"
  fi
  local pair
  for pair in "$@"; do
    install -D -m 0755 "${pair%%:*}" "$rootfs/${pair#*:}"
  done
  chown -R 0:0 "$rootfs"
  [[ -d "$rootfs/home/nonroot" ]] && chown 65532:65532 "$rootfs/home/nonroot"
  find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  # An empty image, its config, then the root filesystem as one layer.
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci config --image "$layout:$tag" --no-history --created "$created" \
    --config.user "$user" --config.entrypoint "$entrypoint" --config.workingdir / \
    --os linux --architecture amd64 "${config_flags[@]}"
  umoci unpack --image "$layout:$tag" "$work/$name/bundle" >/dev/null
  rm -rf "$work/$name/bundle/rootfs"
  mv "$rootfs" "$work/$name/bundle/rootfs"
  touch -h -d "@$SOURCE_DATE_EPOCH" "$work/$name/bundle/rootfs"
  umoci repack --image "$layout:$tag" --refresh-bundle --history.created "$created" \
    --history.created_by "hack/build-images.sh" --history.comment "$ref" "$work/$name/bundle"
  umoci gc --layout "$layout"
  skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$OUT/$name.tar:$ref"
  log "$ref: manifest $(grep -o '"digest":"sha256:[0-9a-f]*"' "$layout/index.json" | head -1 | cut -d'"' -f4)"
}

for image in $images; do
  case "$image" in
    controller)
      config_flags=(
        --config.label "org.opencontainers.image.title=etcd-controller"
        --config.label "org.opencontainers.image.description=The etcd operator's controller"
        --config.label "org.opencontainers.image.version=$VERSION"
        --config.label "org.opencontainers.image.licenses=Apache-2.0"
        --config.exposedports 8080/tcp --config.exposedports 8081/tcp
      )
      assemble controller "etcd-operator/etcd-controller:$VERSION" 65532:65532 \
        /usr/local/bin/etcd-controller "$root/target/release/etcd-controller:/usr/local/bin/etcd-controller"
      ;;
    webhook)
      config_flags=(
        --config.label "org.opencontainers.image.title=etcd-webhook"
        --config.label "org.opencontainers.image.description=The EtcdCluster admission webhook (validation and defaulting)"
        --config.label "org.opencontainers.image.version=$VERSION"
        --config.label "org.opencontainers.image.licenses=Apache-2.0"
        --config.exposedports 9443/tcp --config.exposedports 8080/tcp --config.exposedports 8081/tcp
        # glibc's allocator: large buffers always mmapped (returned to the system when freed)
        # and two arenas, so memory falls back after a burst of large reviews
        # (webhook/benches/memory.rs).
        --config.env "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.arena_max=2"
      )
      assemble webhook "etcd-operator/etcd-webhook:$VERSION" 65532:65532 \
        /usr/local/bin/etcd-webhook "$root/target/release/etcd-webhook:/usr/local/bin/etcd-webhook"
      ;;
    etcd-*)
      v="${image#etcd-}"
      bin="$TOOLS/etcd/v$v/bin"
      [[ -x "$bin/etcd" ]] || { log "etcd $v is not built: run hack/build-tools.sh"; exit 1; }
      files=("$bin/etcd:/usr/local/bin/etcd" "$bin/etcdctl:/usr/local/bin/etcdctl")
      [[ -x "$bin/etcdutl" ]] && files+=("$bin/etcdutl:/usr/local/bin/etcdutl")
      config_flags=(
        --config.label "org.opencontainers.image.title=etcd"
        --config.label "org.opencontainers.image.version=$v"
        --config.exposedports 2379/tcp --config.exposedports 2380/tcp
      )
      assemble "$image" "quay.io/coreos/etcd:v$v" 0:0 /usr/local/bin/etcd "${files[@]}"
      ;;
    pause)
      # Static (glibc's libc.a, which every Rust toolchain's libc6-dev brings), nothing else in
      # the image: what the kubelet's sandbox needs.
      cc -O2 -static -o "$work/pause.bin" "$here/pause/pause.c"
      config_flags=(
        --config.label "org.opencontainers.image.title=pause"
        --config.label "org.opencontainers.image.description=The pod sandbox (hack/pause/pause.c)"
      )
      image_base='' assemble pause "registry.k8s.io/pause:3.10" 65535:65535 /pause "$work/pause.bin:/pause"
      ;;
    coredns)
      bin="$TOOLS/coredns/v$COREDNS_VERSION/bin/coredns"
      [[ -x "$bin" ]] || { log "CoreDNS $COREDNS_VERSION is not built: run ONLY=node hack/build-tools.sh"; exit 1; }
      config_flags=(
        --config.label "org.opencontainers.image.title=coredns"
        --config.label "org.opencontainers.image.version=$COREDNS_VERSION"
        --config.exposedports 53/udp --config.exposedports 53/tcp
      )
      assemble coredns "registry.k8s.io/coredns/coredns:v$COREDNS_VERSION" 65532:65532 /coredns "$bin:/coredns"
      ;;
    *)
      log "unknown image $image (controller, webhook, etcd-X.Y.Z, pause, coredns)"
      exit 2
      ;;
  esac
done
log "images in $OUT (OCI layouts in oci/, docker-archives *.tar)"
