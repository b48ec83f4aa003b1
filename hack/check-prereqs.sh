#!/usr/bin/env bash
# Checks, in a second, what the demo, the tool builds or CI need from the machine, and stops with
# the exact command that installs what is missing (before any 10-minute build finds out).
#
#   hack/check-prereqs.sh demo     what hack/demo.sh needs (Go, Rust, protoc, ip, unshare, disk)
#   hack/check-prereqs.sh tools    what hack/build-tools.sh needs (Go, disk; node and npm for
#                                  Azurite unless ONLY= names another group)
#   hack/check-prereqs.sh images   what hack/build-images.sh needs (umoci, skopeo, apt, dpkg)
#   hack/check-prereqs.sh node     what a real node needs (runc, iptables; hack/demo.sh --real-node)
#   hack/check-prereqs.sh ci       everything the whole test suite needs
#
# Exit 0 when everything is there, 1 otherwise (every problem is listed first).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
what="${1:-demo}"

# Go 1.26: the version the pinned Kubernetes and etcd modules build with here (GOTOOLCHAIN=local,
# so an older Go fails only minutes into the Kubernetes build).
GO_MIN=1.26
# Rust: the workspace's rust-version.
RUST_MIN="$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$here/../Cargo.toml" | head -1)"
# Free disk the first build takes, in two parts: the tools (Go module and build caches ~16 GB with
# every tool, cert-manager's ~3 GB of build cache among them, ~6 GB for the demo's, plus ~1.7 GB
# of binaries), needed only while a tool is not yet in the cache, and target/ (~12 GB for the
# whole suite with release images, ~4 GB for the demo).
case "$what" in
  demo) TARGET_GB=4 TOOLS_GB=7 TOOLS_ONLY=demo ;;
  tools) TARGET_GB=0 TOOLS_GB=19 TOOLS_ONLY="${ONLY:-all}" ;;
  images) TARGET_GB=4 TOOLS_GB=0 TOOLS_ONLY= ;;
  node) TARGET_GB=4 TOOLS_GB=0 TOOLS_ONLY= ;;
  *) TARGET_GB=12 TOOLS_GB=19 TOOLS_ONLY=all ;;
esac

problems=()
apt=()
say() { problems+=("$1"); }

# version_at_least HAVE WANT: true when HAVE >= WANT (dotted numbers).
version_at_least() {
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" == "$2" ]]
}

check_go() {
  if ! command -v go >/dev/null 2>&1; then
    say "Go is not installed: Go $GO_MIN or newer from https://go.dev/dl/ (the Debian package is too old), with go on PATH"
    return
  fi
  local have; have="$(go env GOVERSION 2>/dev/null | sed 's/^go//')"
  version_at_least "${have:-0}" "$GO_MIN" ||
    say "Go ${have:-?} is too old: Go $GO_MIN or newer is needed (https://go.dev/dl/)"
}

check_rust() {
  if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
    say "Rust is not installed: curl --proto '=https' -sSf https://sh.rustup.rs | sh -s -- -y (then open a new shell)"
    return
  fi
  local have; have="$(rustc --version | awk '{ print $2 }')"
  version_at_least "${have%%-*}" "$RUST_MIN" ||
    say "Rust $have is too old: $RUST_MIN or newer is needed: rustup update stable"
}

check_command() { # check_command COMMAND DEBIAN_PACKAGE WHY
  command -v "$1" >/dev/null 2>&1 && return 0
  say "$1 is missing ($3)"
  apt+=("$2")
}

check_disk() {
  local dir="${ETCD_OPERATOR_TOOLS:-$HOME/.cache/etcd-operator/tools}"
  mkdir -p "$dir" 2>/dev/null || true
  local need_gb=$TARGET_GB why="target/"
  # The Go caches are only filled while a tool is missing: a warm tool cache needs none of it.
  if ((TOOLS_GB > 0)) && ! ONLY="$TOOLS_ONLY" "$here/build-tools.sh" --check >/dev/null 2>&1; then
    need_gb=$((need_gb + TOOLS_GB))
    why="Go caches and tools"
    ((TARGET_GB == 0)) || why="$why, target/"
  fi
  local free_kb
  free_kb="$(df -Pk "$here/.." | awk 'NR == 2 { print $4 }')"
  local free_gb=$((free_kb / 1024 / 1024))
  ((free_gb >= need_gb)) ||
    say "only ${free_gb} GB free where the repo is; this build needs about ${need_gb} GB ($why)"
}

check_go
case "$what" in
  demo)
    check_rust
    check_command protoc protobuf-compiler "etcd-client's build script compiles etcd's protocol files with it"
    check_command ip iproute2 "the pod network of the local control plane"
    check_command unshare util-linux "the private network and mount namespace of the demo"
    ;;
  tools)
    if [[ "${ONLY:-all}" == all || "${ONLY:-}" == abs ]]; then
      check_command node nodejs "Azurite, the Azure Blob Storage server of the backup tests, runs on node"
      check_command npm npm "Azurite is installed from the npm registry"
    fi
    check_command perl perl "the fake-gcs-server patch"
    ;;
  images)
    check_command umoci umoci "assembles the OCI images"
    check_command skopeo skopeo "writes each image as a docker-archive too"
    check_command apt-get apt "fetches the base image's Debian packages"
    check_command dpkg-deb dpkg "unpacks them"
    check_command cc gcc "compiles the pause image's program (hack/pause/pause.c)"
    ;;
  node)
    check_command runc runc "the real node's containerd runs containers with it"
    check_command iptables-restore iptables "the real node's kube-proxy and CNI plugins program iptables"
    ;;
  ci)
    check_rust
    check_command protoc protobuf-compiler "etcd-client's build script compiles etcd's protocol files with it"
    check_command ip iproute2 "the pod network of the local control plane"
    check_command unshare util-linux "the private network and mount namespace of the tests"
    check_command node nodejs "Azurite, the Azure Blob Storage server of the backup tests, runs on node"
    check_command npm npm "Azurite is installed from the npm registry"
    check_command perl perl "the fake-gcs-server patch"
    check_command umoci umoci "hack/build-images.sh assembles the OCI images"
    check_command skopeo skopeo "hack/build-images.sh writes each image as a docker-archive too"
    check_command runc runc "the images test runs the operator's images"
    check_command cc gcc "hack/build-images.sh compiles the pause image's program"
    check_command iptables-restore iptables "the real node's kube-proxy and CNI plugins program iptables"
    ;;
  *)
    echo "usage: hack/check-prereqs.sh [demo|tools|images|node|ci]" >&2
    exit 2
    ;;
esac
check_disk

if ((${#problems[@]} == 0)); then
  exit 0
fi
{
  echo "check-prereqs ($what): this machine lacks what the build needs:"
  for p in "${problems[@]}"; do echo "  - $p"; done
  if ((${#apt[@]})); then
    echo "install the Debian packages with:"
    echo "  apt-get update && apt-get install -y ${apt[*]}"
  fi
} >&2
exit 1
