#!/usr/bin/env bash
# Builds the pinned Go tools (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd + etcdctl at several versions, helm 3 and helm 4, versitygw, fake-gcs-server,
# prometheus + promtool, cert-manager's controller and webhook) from the Go module proxy, etcd
# 3.2-3.4 from their upstream source archives, and Azurite from the npm registry, into a cache
# outside the repo, keyed by version.
# Idempotent: a warm cache costs well under a second per tool.
#
#   hack/build-tools.sh            build whatever is missing, then print each tool's version
#   hack/build-tools.sh --check    exit 1 (building nothing) when something is missing
#   ONLY=helm hack/build-tools.sh  only one group: etcd, etcd-source, kubernetes, helm, s3,
#                                  abs, gcs, prometheus, node, netpol, porcupine, clientv3 or
#                                  cert-manager
#   ONLY=demo hack/build-tools.sh  only what hack/demo.sh runs: Kubernetes, the API server's
#                                  etcd (also the default member version), the example's etcd
#                                  and Helm 3
#
# Cache: $ETCD_OPERATOR_TOOLS (default ~/.cache/etcd-operator/tools). Go's own module and
# build caches (GOMODCACHE, GOCACHE) stay where Go puts them, also outside the repo.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
TOOLS="${ETCD_OPERATOR_TOOLS:-$HOME/.cache/etcd-operator/tools}"
mode="${1:-build}"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
if [[ "$mode" != "--check" ]]; then
  "$here/check-prereqs.sh" tools
fi

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Prints a line every 100 packages compiled, so long builds show progress.
progress() {
  awk -v what="$1" '{ n++; if (n % 100 == 0) { printf("[build-tools] %s: %d packages compiled\n", what, n) > "/dev/stderr"; fflush("/dev/stderr") } }
    END { printf("[build-tools] %s: %d packages compiled in all\n", what, n) > "/dev/stderr" }'
}

missing=0
# module_field FIELD MODULE@VERSION: a field ("Dir", "GoMod") of `go mod download -json`
# (downloads the module into the Go module cache).
module_field() { go mod download -json "$2" | sed -n "s/.*\"$1\": \"\(.*\)\".*/\1/p"; }
need() { # need DIR: true when DIR has no completed build
  if [[ -f "$1/.complete" ]]; then return 1; fi
  if [[ "$mode" == "--check" ]]; then log "missing: $1"; missing=1; return 1; fi
  return 0
}

build_kubernetes() {
  local v="$KUBERNETES_VERSION" out="$TOOLS/kubernetes/v$KUBERNETES_VERSION"
  need "$out" || return 0
  log "building Kubernetes v$v (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl); first build about 5 min on an idle 2-core machine (0.5 GB of modules), more on a busy one"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init k8sbuild >/dev/null 2>&1
    local gomod
    gomod="$(module_field GoMod "k8s.io/kubernetes@v$v")"
    [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@v$v"; exit 1; }
    local minor="${v#*.}"; minor="${minor%%.*}"
    local gover; gover="$(awk '$1 == "go" { print $2; exit }' "$gomod")"
    go mod edit -go="$gover"
    # Dependencies' godebug lines are ignored; copy kubernetes' own into the wrapper.
    awk '$1 == "godebug" && $2 != "(" { print $2 }' "$gomod" | while read -r kv; do go mod edit -godebug="$kv"; done
    awk '/^godebug \(/ { on = 1; next } on && /^\)/ { on = 0 } on { print $1 }' "$gomod" | while read -r kv; do go mod edit -godebug="$kv"; done
    # Every staging module kubernetes replaces with ./staging/src/k8s.io/NAME comes from the proxy at v0.MINOR.PATCH.
    grep -oE 'k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | awk '{ print $1 }' | sort -u |
      while read -r m; do go mod edit -replace="$m=$m@v0.${v#*.}"; done
    go mod edit -require="k8s.io/kubernetes@v$v"
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    log "resolving modules (about 0.5 GB of downloads on a cold module cache)"
    go mod tidy -e >/dev/null
    local ldf="-s -w" date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf+=" -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.buildDate=$date"
    done
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o "$out/bin.tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl 2>&1 | progress "kubernetes v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]] || exit 1
  ) || { rm -rf "$work" "$out/bin.tmp"; log "kubernetes build failed"; return 1; }
  rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

build_etcd() {
  local v="$1" out="$TOOLS/etcd/v$1"
  need "$out" || return 0
  log "building etcd v$v (etcd, etcdctl)"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init etcdbuild >/dev/null 2>&1
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
GO
    local mods=("go.etcd.io/etcd/server/v3@v$v" "go.etcd.io/etcd/etcdctl/v3@v$v" "go.etcd.io/etcd/etcdutl/v3@v$v")
    go get "${mods[@]}" >/dev/null 2>&1 || go get "${mods[@]}"
    go mod tidy -e >/dev/null
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcd" go.etcd.io/etcd/server/v3 2>&1 | progress "etcd v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]] || exit 1
    go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3
    # etcdutl (3.5+): the offline snapshot restore the restore of an EtcdRestore runs.
    go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcdutl" go.etcd.io/etcd/etcdutl/v3
  ) || { rm -rf "$work" "$out/bin.tmp"; log "etcd v$v build failed"; return 1; }
  rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# A cache filled before etcdutl was part of the build: add it alone (3.5+ from the proxy).
build_etcdutl() {
  local v="$1" out="$TOOLS/etcd/v$1"
  [[ -f "$out/.complete" && ! -x "$out/bin/etcdutl" ]] || return 0
  if [[ "$mode" == "--check" ]]; then log "missing: $out/bin/etcdutl"; missing=1; return 0; fi
  log "building etcdutl v$v"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init etcdutlbuild >/dev/null 2>&1
    go get "go.etcd.io/etcd/etcdutl/v3@v$v" >/dev/null 2>&1 || go get "go.etcd.io/etcd/etcdutl/v3@v$v"
    go build -trimpath -ldflags "-s -w" -o "$out/bin/etcdutl.tmp" go.etcd.io/etcd/etcdutl/v3
  ) || { rm -rf "$work" "$out/bin/etcdutl.tmp"; log "etcdutl v$v build failed"; return 1; }
  rm -rf "$work"; mv "$out/bin/etcdutl.tmp" "$out/bin/etcdutl"
}

# The S3 server of the backup tests: the Versity S3 Gateway (a real S3 implementation: SigV4,
# buckets, multipart, object metadata) over a POSIX directory.
build_versitygw() {
  local v="$VERSITYGW_VERSION" out="$TOOLS/versitygw/v$VERSITYGW_VERSION"
  need "$out" || return 0
  log "building versitygw v$v (the S3 server of the backup tests); first build 2-3 min on 2 cores"
  mkdir -p "$out/bin.tmp"
  GOBIN="$out/bin.tmp" go install -v -trimpath -ldflags "-s -w" \
    "github.com/versity/versitygw/cmd/versitygw@v$v" 2>&1 | progress "versitygw v$v"
  [[ "${PIPESTATUS[0]}" == 0 ]] || { rm -rf "$out/bin.tmp"; log "versitygw v$v build failed"; return 1; }
  rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# The GCS server of the backup tests: fake-gcs-server (the JSON and XML APIs of Cloud Storage,
# object metadata) over a directory. One patch, checked to apply: GCS's XML API takes an
# authenticated `PUT /BUCKET/OBJECT` (its "PUT Object" upload, what object_store sends), which
# fake-gcs-server v1.56.1 routes to its upload code only when the URL carries a signature
# (`X-Goog-Algorithm`); the patch lets a PUT through without one. (object_store's own CI runs a
# fork of fake-gcs-server with that support; fake-gcs-server has no XML multipart upload, so
# snapshots above one part, 8 MiB, reach real GCS only.)
build_fake_gcs_server() {
  local v="$FAKE_GCS_SERVER_VERSION" out="$TOOLS/fake-gcs-server/v$FAKE_GCS_SERVER_VERSION"
  need "$out" || return 0
  local mod="github.com/fsouza/fake-gcs-server"
  log "building fake-gcs-server v$v (the GCS server of the backup tests); first build 2-4 min on 2 cores"
  local dir work
  dir="$(module_field Dir "$mod@v$v")"
  [[ -f "$dir/go.mod" ]] || { log "could not download $mod@v$v"; return 1; }
  work="$(mktemp -d)"
  (
    cp -r "$dir/." "$work/" && chmod -R u+w "$work" && cd "$work"
    local f=fakestorage/upload.go guard='if r.URL.Query().Get("X-Goog-Algorithm") != "" {'
    grep -qF "$guard" "$f" || { log "$f: the signed-upload guard to patch was not found"; exit 1; }
    sed -i 's/if r.URL.Query().Get("X-Goog-Algorithm") != "" {/if r.URL.Query().Get("X-Goog-Algorithm") != "" || r.Method == http.MethodPut {/' "$f"
    local answer='return jsonResponse{data: newObjectResponse(obj.ObjectAttrs, urlhelper.GetBaseURL(r))}'
    grep -qF "$answer" "$f" || { log "$f: the upload answer to patch was not found"; exit 1; }
    # Only in signedUpload (the function the PUT reaches): its first such return.
    perl -0pi -e 's/(func \(s \*Server\) signedUpload.*?)return jsonResponse\{data: newObjectResponse\(obj\.ObjectAttrs, urlhelper\.GetBaseURL\(r\)\)\}/$1return jsonResponse{header: http.Header{"Etag": []string{fmt.Sprintf("%q", obj.Etag)}}, data: newObjectResponse(obj.ObjectAttrs, urlhelper.GetBaseURL(r))}/s' "$f"
    grep -qF 'header: http.Header{"Etag"' "$f" || { log "$f: the ETag patch did not apply"; exit 1; }
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -ldflags "-s -w" -o "$out/bin.tmp/fake-gcs-server" . 2>&1 | progress "fake-gcs-server v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]] || exit 1
  ) || { chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin.tmp"; log "fake-gcs-server v$v build failed"; return 1; }
  chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# The Azure Blob Storage server of the backup tests: Azurite (Microsoft's emulator, the Blob
# REST API with Shared Key auth and user metadata) from the npm registry, run by the machine's
# node; bin/azurite-blob starts its blob service alone.
install_azurite() {
  local v="$AZURITE_VERSION" out="$TOOLS/azurite/v$AZURITE_VERSION"
  need "$out" || return 0
  command -v npm >/dev/null || { log "azurite needs node and npm (Debian: nodejs, npm)"; return 1; }
  log "installing azurite v$v (the ABS server of the backup tests) from the npm registry"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/bin"
  npm install --prefix "$out.tmp" --no-audit --no-fund --no-save --loglevel=error "azurite@$v" >&2 ||
    { rm -rf "$out.tmp"; log "azurite v$v install failed"; return 1; }
  local main="node_modules/azurite/dist/src/blob/main.js"
  [[ -f "$out.tmp/$main" ]] || { rm -rf "$out.tmp"; log "azurite v$v: no $main"; return 1; }
  printf '#!/bin/sh\nexec node "$(dirname "$0")/../%s" "$@"\n' "$main" > "$out.tmp/bin/azurite-blob"
  chmod +x "$out.tmp/bin/azurite-blob"
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.complete"
}

# Prometheus and promtool (the Prometheus tests): `go install` of the module version pinned in
# PROMETHEUS_VERSION (v0.3XX.Y is Prometheus 3.XX.Y), with the release's version stamped in as
# upstream's Makefile does (read from the module's VERSION file), so `--version` names it.
# The web UI's assets are not built (the tests use the HTTP API only), and of the service
# discoveries only Kubernetes' (the tests discover targets as a cluster's Prometheus does;
# static and file discovery are always in): upstream's build tags `remove_all_sd` and
# `enable_kubernetes_sd` leave out the cloud SDKs, most of the build.
PROMETHEUS_TAGS="remove_all_sd,enable_kubernetes_sd"
build_prometheus() {
  local v="$PROMETHEUS_VERSION" out="$TOOLS/prometheus/v$PROMETHEUS_VERSION"
  # A build of other tags (the full one of earlier caches) is built again.
  if [[ -f "$out/.complete" && "$(cat "$out/.tags" 2>/dev/null)" != "$PROMETHEUS_TAGS" && "$mode" != "--check" ]]; then
    rm -f "$out/.complete"
  fi
  need "$out" || return 0
  local mod="github.com/prometheus/prometheus"
  log "building prometheus and promtool ($mod@v$v, tags $PROMETHEUS_TAGS)"
  local dir release
  dir="$(module_field Dir "$mod@v$v")"
  [[ -f "$dir/VERSION" ]] || { log "could not download $mod@v$v"; return 1; }
  release="$(tr -d '[:space:]' < "$dir/VERSION")"
  local pkg="github.com/prometheus/common/version"
  local ldf="-s -w -X $pkg.Version=$release -X $pkg.Revision=v$v -X $pkg.Branch=v$release -X $pkg.BuildUser=build-tools"
  mkdir -p "$out/bin.tmp"
  GOBIN="$out/bin.tmp" go install -v -trimpath -tags "$PROMETHEUS_TAGS" -ldflags "$ldf" \
    "$mod/cmd/prometheus@v$v" "$mod/cmd/promtool@v$v" 2>&1 | progress "prometheus v$release"
  [[ "${PIPESTATUS[0]}" == 0 ]] || { rm -rf "$out/bin.tmp"; log "prometheus v$v build failed"; return 1; }
  "$out/bin.tmp/promtool" --version 2>&1 | grep "version $release" >/dev/null ||
    { rm -rf "$out/bin.tmp"; log "promtool: the binary does not report version $release"; return 1; }
  rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; echo "$PROMETHEUS_TAGS" > "$out/.tags"; touch "$out/.complete"
}

# The archive of etcd tag v$1: from ../shared/third_party/etcd beside the repo when present,
# else downloaded from upstream. Checked against its pinned SHA-256 either way.
etcd_source_archive() {
  local v="$1" dest="$2" key want got
  key="ETCD_SOURCE_SHA256_${v//./_}"; want="${!key:-}"
  [[ -n "$want" ]] || { log "hack/versions.env has no $key"; return 1; }
  local local_archive="$here/../../shared/third_party/etcd/etcd-v$v.tar.gz"
  if [[ -f "$local_archive" ]]; then
    cp "$local_archive" "$dest"
  else
    local url="https://github.com/etcd-io/etcd/archive/refs/tags/v$v.tar.gz"
    log "no ../shared/third_party/etcd beside the repo: downloading etcd v$v's source from $url"
    curl -fsSL --retry 3 -o "$dest" "$url" || { log "download of $url failed"; return 1; }
  fi
  got="$(sha256sum "$dest" | awk '{ print $1 }')"
  [[ "$got" == "$want" ]] || { log "etcd v$v archive: SHA-256 $got, expected $want"; return 1; }
}

# etcd 3.2-3.4 from source (recipe: ../shared/third_party/etcd/README.md). 3.2 and 3.3 build in
# GOPATH mode from their vendored tree; 3.2's vendored ugorji codec needs one patch for Go
# 1.22+ (a base64 alphabet with a duplicate symbol panics at start-up; upstream ugorji's fix);
# 3.4 builds in module mode with dependencies from the Go module proxy.
build_etcd_source() {
  local v="$1" out="$TOOLS/etcd/v$1"
  need "$out" || return 0
  log "building etcd v$v (etcd, etcdctl) from its source archive; first build 2-5 min on 2 cores"
  local work; work="$(mktemp -d)"
  (
    etcd_source_archive "$v" "$work/src.tar.gz"
    # GitHub's archives unpack to etcd-X.Y.Z/, `git archive --prefix` ones to etcd-vX.Y.Z/.
    mkdir "$work/src" && tar -xzf "$work/src.tar.gz" -C "$work/src" --strip-components=1
    cd "$work/src"
    case "$v" in
      3.2.*)
        local codec=cmd/vendor/github.com/ugorji/go/codec/gen.go
        grep -q '0123456789__")' "$codec" || { log "$codec: expected alphabet not found"; exit 1; }
        sed -i 's/0123456789__")/0123456789_.")/' "$codec"
        GO111MODULE=off GOFLAGS= GO_LDFLAGS="-s -w" ./build 2>&1 | grep -v 'not a git repository' >&2 || true
        ;;
      3.3.*)
        ETCD_SETUP_GOPATH=1 GO111MODULE=off GOFLAGS= GO_LDFLAGS="-s -w" bash ./build 2>&1 | grep -v 'not a git repository' >&2 || true
        ;;
      *)
        GO111MODULE=on GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o bin/etcd . &&
          GO111MODULE=on GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o bin/etcdctl ./etcdctl
        ;;
    esac
    [[ -x bin/etcd && -x bin/etcdctl ]] || { log "etcd v$v: build produced no bin/etcd and bin/etcdctl"; exit 1; }
    bin/etcd --version | grep "etcd Version: $v" >/dev/null || { log "etcd v$v: bin/etcd reports another version"; exit 1; }
    mkdir -p "$out/bin.tmp" && cp bin/etcd bin/etcdctl "$out/bin.tmp/"
  ) || { chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin.tmp"; log "etcd v$v build failed"; return 1; }
  chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# helm MAJOR at VERSION (go install of helm.sh/helm/vMAJOR/cmd/helm) into helm/vVERSION, with
# the ldflags of upstream's Makefile: the version and tree state, and for Helm 3 the default
# Kubernetes version of `helm template` and `helm lint` (client-go's minor; Helm 4 reads it
# from its build info at run time).
build_helm_major() {
  local major="$1" v="$2" out="$TOOLS/helm/v$2"
  need "$out" || return 0
  local mod="helm.sh/helm/v$major"
  log "building helm v$v ($mod); first build 2-5 min on 2 cores"
  local ldf="-s -w -X $mod/internal/version.version=v$v -X $mod/internal/version.gitTreeState=clean"
  if [[ "$major" == 3 ]]; then
    local gomod client_go
    gomod="$(module_field GoMod "$mod@v$v")"
    [[ -f "$gomod" ]] || { log "could not download $mod@v$v"; return 1; }
    client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")" # v0.MINOR.PATCH
    local k8s_minor="${client_go#v0.}"; k8s_minor="${k8s_minor%%.*}"
    for pkg in "$mod/pkg/lint/rules" "$mod/pkg/chartutil"; do
      ldf+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
    done
  fi
  mkdir -p "$out/bin.tmp"
  GOBIN="$out/bin.tmp" go install -v -trimpath -ldflags "$ldf" "$mod/cmd/helm@v$v" 2>&1 | progress "helm v$v"
  [[ "${PIPESTATUS[0]}" == 0 ]] || { rm -rf "$out/bin.tmp"; log "helm v$v build failed"; return 1; }
  "$out/bin.tmp/helm" version --short | grep "^v$v" >/dev/null || { rm -rf "$out/bin.tmp"; log "helm v$v: the binary reports another version"; return 1; }
  rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# A real node: kubelet and kube-proxy from the pinned Kubernetes (the same wrapper module as
# build_kubernetes, so its module and build caches are shared), containerd 2.x
# (containerd, its runc shim, ctr) and the CNI plugins a bridge network needs.
build_node() {
  local v="$KUBERNETES_VERSION" out="$TOOLS/node/v$KUBERNETES_VERSION-containerd$CONTAINERD_VERSION-cni$CNI_PLUGINS_VERSION"
  need "$out" || return 0
  log "building a real node: kubelet and kube-proxy v$v, containerd v$CONTAINERD_VERSION, CNI plugins v$CNI_PLUGINS_VERSION; first build about 70 s on 2 cores after Kubernetes"
  local work; work="$(mktemp -d)"
  (
    set -e
    mkdir -p "$out/bin.tmp/cni" "$work/k8s" "$work/containerd" "$work/cni"
    cd "$work/k8s"
    go mod init nodebuild >/dev/null 2>&1
    local gomod minor gover
    gomod="$(module_field GoMod "k8s.io/kubernetes@v$v")"
    [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@v$v"; exit 1; }
    minor="${v#*.}"; minor="${minor%%.*}"
    gover="$(awk '$1 == "go" { print $2; exit }' "$gomod")"
    go mod edit -go="$gover"
    awk '$1 == "godebug" && $2 != "(" { print $2 }' "$gomod" | while read -r kv; do go mod edit -godebug="$kv"; done
    awk '/^godebug \(/ { on = 1; next } on && /^\)/ { on = 0 } on { print $1 }' "$gomod" | while read -r kv; do go mod edit -godebug="$kv"; done
    grep -oE 'k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" | awk '{ print $1 }' | sort -u |
      while read -r m; do go mod edit -replace="$m=$m@v0.${v#*.}"; done
    go mod edit -require="k8s.io/kubernetes@v$v"
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n)\n' > tools.go
    go mod tidy -e >/dev/null
    local ldf="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldf+=" -X $pkg.gitVersion=v$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    go build -v -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" -o "$out/bin.tmp/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy 2>&1 | progress "kubelet v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]]
    cd "$work/containerd"
    go mod init containerdbuild >/dev/null 2>&1
    go get "github.com/containerd/containerd/v2@v$CONTAINERD_VERSION" >/dev/null 2>&1
    printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n)\n' > tools.go
    go mod tidy -e >/dev/null
    local cmd="github.com/containerd/containerd/v2/cmd"
    go build -v -trimpath -tags no_btrfs,no_devmapper,no_zfs \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" \
      -o "$out/bin.tmp/" "$cmd/containerd" "$cmd/containerd-shim-runc-v2" "$cmd/ctr" 2>&1 | progress "containerd v$CONTAINERD_VERSION"
    [[ "${PIPESTATUS[0]}" == 0 ]]
    cd "$work/cni"
    go mod init cnibuild >/dev/null 2>&1
    go get "github.com/containernetworking/plugins@v$CNI_PLUGINS_VERSION" >/dev/null 2>&1
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/containernetworking/plugins/plugins/main/bridge"\n' > tools.go
    go mod tidy -e >/dev/null
    local p="github.com/containernetworking/plugins/plugins"
    go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/cni/" \
      "$p/main/bridge" "$p/main/loopback" "$p/ipam/host-local" "$p/meta/portmap"
  ) || { rm -rf "$work" "$out/bin.tmp"; log "real node build failed"; return 1; }
  rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# CoreDNS for the real node's cluster DNS: hack/coredns/main.go, its plugins only (the
# kubernetes zone, cache, health, ready, errors, log), static.
build_coredns() {
  local v="$COREDNS_VERSION" out="$TOOLS/coredns/v$COREDNS_VERSION"
  need "$out" || return 0
  log "building CoreDNS v$v (hack/coredns); first build about 60 s on 2 cores"
  local work; work="$(mktemp -d)"
  (
    set -e
    mkdir -p "$out/bin.tmp"
    cp "$here/coredns/main.go" "$work/"
    cd "$work"
    go mod init corednsbuild >/dev/null 2>&1
    go get "github.com/coredns/coredns@v$v" >/dev/null 2>&1
    go mod tidy -e >/dev/null 2>&1
    CGO_ENABLED=0 go build -v -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$v" \
      -o "$out/bin.tmp/coredns" . 2>&1 | progress "coredns v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]]
    "$out/bin.tmp/coredns" -version | grep "^CoreDNS-$v$" >/dev/null
  ) || { rm -rf "$work" "$out/bin.tmp"; log "CoreDNS v$v build failed"; return 1; }
  rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# kube-network-policies (sigs.k8s.io/kube-network-policies, the NetworkPolicy enforcer kind
# ships): the real node's enforcer (tests/src/network_policies.rs), a process in the node's
# network namespace. Its main package is the module's cmd/ (package main, built as
# bin/kube-network-policies). How it enforces: an nftables table `inet kube-network-policies`
# whose postrouting chain (and a prerouting one for DNS) sends the first packet of each
# connection to or from a local pod that a policy selects to nfqueue 100; the process reads
# the queue (nfnetlink_queue) and answers accept or drop from the policies, pods and namespaces
# it watches. What it needs from the kernel, in the node's network namespace: nf_tables (inet
# family, sets, lookup, ct, meta, payload), nfnetlink_queue, conntrack, and br_netfilter with
# bridge-nf-call-iptables=1 (pods on one bridge: their packets are bridged, not routed), and
# nft_queue for its `queue` statement. This machine's kernel (6.18, no loadable modules) has
# all of them but nft_queue (CONFIG_NFT_QUEUE is not set): upstream's rules are refused
# ("netlink receive: no such file or directory", `nft add rule ... queue num 100` fails the
# same way) and nothing is enforced. Two additions, checked to apply (hack/kube-network-policies):
# - xt_nfqueue.go: the queue statement written as the xtables NFQUEUE target (revision 3)
#   through nft_compat (CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE, both built in),
#   what `iptables-nft -j NFQUEUE` installs: the same queue, the same verdicts;
# - kubeconfig.go: a --kubeconfig flag (upstream's main only has in-cluster configuration).
# Its NRI plugin (pod IPs from the runtime before the API server has them) connects to the
# socket in NRI_PLUGIN_SOCKET (a file descriptor) when set, else /var/run/nri/nri.sock.
# Built with the node group or alone (ONLY=netpol). Keyed by version and a hash of
# hack/kube-network-policies/*.go.
netpol_source_sum() { (cd "$here/kube-network-policies" && export LC_ALL=C && cat ./*.go | sha256sum | cut -c1-16); }
build_netpol() {
  local v="$KUBE_NETWORK_POLICIES_VERSION" out="$TOOLS/kube-network-policies/v$KUBE_NETWORK_POLICIES_VERSION" sum
  sum="$(netpol_source_sum)"
  if [[ -f "$out/.complete" && "$(cat "$out/.source" 2>/dev/null)" != "$sum" && "$mode" != "--check" ]]; then
    rm -f "$out/.complete"
  fi
  need "$out" || return 0
  local mod="sigs.k8s.io/kube-network-policies"
  log "building kube-network-policies v$v (the real node's NetworkPolicy enforcer); first build about 5 min on a busy 2-core machine with an empty Go build cache"
  local dir work
  dir="$(module_field Dir "$mod@v$v")"
  [[ -f "$dir/cmd/main.go" ]] || { log "could not download $mod@v$v"; return 1; }
  work="$(mktemp -d)"
  # (No `set -e`: it does not apply in a subshell whose status `||` tests; each step exits.)
  (
    cp -r "$dir/." "$work/" && chmod -R u+w "$work" && cd "$work" || exit 1
    local main=cmd/main.go ctl=pkg/networkpolicy/controller.go
    [[ "$(grep -c '^	config, err := rest.InClusterConfig()$' "$main")" == 1 ]] ||
      { log "$main: the in-cluster configuration call to patch was not found"; exit 1; }
    sed -i -e 's/^	config, err := rest.InClusterConfig()$/	config, err := restConfig()/' \
      -e '/^	"k8s.io\/client-go\/rest"$/d' "$main" || exit 1
    cp "$here/kube-network-policies/kubeconfig.go" cmd/ || exit 1
    # Each `queue := &expr.Queue{...}` and its fail-open flag (two of them).
    perl -0pi -e 's/queue := &expr\.Queue\{Num: uint16\(c\.config\.QueueID\)\}\n\tif c\.config\.FailOpen \{\n\t\tqueue\.Flag = expr\.QueueFlagBypass\n\t\}/queue := nfqueueStatement(c.config.QueueID, c.config.FailOpen)/g' "$ctl" || exit 1
    [[ "$(grep -c 'queue := nfqueueStatement(c.config.QueueID, c.config.FailOpen)' "$ctl")" == 2 &&
      "$(grep -c 'expr\.Queue' "$ctl")" == 0 ]] ||
      { log "$ctl: the two expr.Queue statements to patch were not found"; exit 1; }
    cp "$here/kube-network-policies/xt_nfqueue.go" pkg/networkpolicy/ || exit 1
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -ldflags "-s -w" -o "$out/bin.tmp/kube-network-policies" ./cmd 2>&1 |
      tee build.log | progress "kube-network-policies v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]] || { grep -E '^#|\.go:[0-9]+' build.log >&2; exit 1; }
    # No version flag upstream: the binary must at least carry the patched flag set.
    # (Its -h output to a file first: `grep -q` closing the pipe early fails it under pipefail.)
    "$out/bin.tmp/kube-network-policies" -h > help.txt 2>&1
    grep -q -- '-kubeconfig' help.txt || { log "kube-network-policies: the binary has no --kubeconfig flag"; exit 1; }
  ) || { chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin.tmp"; log "kube-network-policies v$v build failed"; return 1; }
  chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"
  echo "$sum" > "$out/.source"; touch "$out/.complete"
}

# Porcupine's test data, the validation of etcd-lincheck (lincheck/tests/porcupine_jepsen.rs):
# its Jepsen etcd histories (test_data/jepsen/) and porcupine_test.go (their expected verdicts),
# copied from the Go module (nothing is built).
PORCUPINE_VERSION=1.3.1
fetch_porcupine() {
  local v="$PORCUPINE_VERSION" out="$TOOLS/porcupine/v$PORCUPINE_VERSION"
  need "$out" || return 0
  local mod="github.com/anishathalye/porcupine" dir
  log "fetching $mod@v$v (the Jepsen etcd histories etcd-lincheck is checked against)"
  dir="$(module_field Dir "$mod@v$v")"
  [[ -f "$dir/porcupine_test.go" && -d "$dir/test_data/jepsen" ]] || { log "could not download $mod@v$v"; return 1; }
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/test_data"
  # The module cache is read-only: the copy is made writable so a later rm -rf works.
  { cp -r "$dir/test_data/jepsen" "$out.tmp/test_data/" && cp "$dir/porcupine_test.go" "$out.tmp/" &&
    chmod -R u+w "$out.tmp"; } || { rm -rf "$out.tmp"; log "porcupine v$v: copy failed"; return 1; }
  rm -rf "$out"; mv "$out.tmp" "$out"; touch "$out/.complete"
}

# clientv3-load (hack/clientv3-load): etcd's own Go client as a load generator and history
# recorder (tests/src/clientv3.rs), keyed by a hash of its sources (go.mod, go.sum, *.go).
clientv3_load_dir() {
  local sum; sum="$(cd "$here/clientv3-load" && export LC_ALL=C && cat go.mod go.sum ./*.go | sha256sum)"
  echo "$TOOLS/clientv3-load/${sum:0:16}"
}
build_clientv3_load() {
  local out; out="$(clientv3_load_dir)"
  need "$out" || return 0
  log "building clientv3-load (hack/clientv3-load, go.etcd.io/etcd/client/v3); first build about 45 s on 2 cores, under 10 s after etcd (the same packages)"
  mkdir -p "$out/bin.tmp"
  (cd "$here/clientv3-load" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$out/bin.tmp/clientv3-load" .) ||
    { rm -rf "$out/bin.tmp"; log "clientv3-load build failed"; return 1; }
  rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

# cert-manager (the cert_manager suite): its controller and webhook from the module
# github.com/cert-manager/cert-manager at CERT_MANAGER_VERSION, plus its CRDs. Upstream's
# cmd/controller and cmd/webhook are separate, untagged Go modules (their go.mod replaces the
# root module with ../../), which the Go module proxy does not serve; hack/cert-manager/ holds
# two small mains of ours that start the root module's controllers and webhook server the way
# they do (see each main.go). The wrapper module's path is under
# github.com/cert-manager/cert-manager/ because the configuration types and the webhook server
# are internal packages of that tree. Its only requirement is the root module, so every
# dependency is at the version cert-manager's own go.mod selects.
# The CRDs are the module's deploy/crds/*.yaml (controller-gen output, no Helm templating),
# concatenated in name order into crds.yaml; their specs are those the Helm chart's
# templates/crd-*.yaml render (checked for v1.21.2: the chart adds labels only).
# Keyed by version and a hash of hack/cert-manager/**/*.go: an edit of a main rebuilds.
CERT_MANAGER_MODULE_PATH="github.com/cert-manager/cert-manager/etcd-operator-harness"
cert_manager_source_sum() { (cd "$here/cert-manager" && export LC_ALL=C && find . -name '*.go' | sort | xargs cat | sha256sum | cut -c1-16); }
build_cert_manager() {
  local v="$CERT_MANAGER_VERSION" out="$TOOLS/cert-manager/v$CERT_MANAGER_VERSION" sum
  sum="$(cert_manager_source_sum)"
  if [[ -f "$out/.complete" && "$(cat "$out/.source" 2>/dev/null)" != "$sum" && "$mode" != "--check" ]]; then
    rm -f "$out/.complete"
  fi
  need "$out" || return 0
  local mod="github.com/cert-manager/cert-manager"
  log "building cert-manager v$v (controller, webhook; hack/cert-manager) and its CRDs; first build about 8 min on a busy 2-core machine with empty Go caches (3 GB of build cache)"
  local dir work
  dir="$(module_field Dir "$mod@v$v")"
  [[ -d "$dir/deploy/crds" ]] || { log "could not download $mod@v$v"; return 1; }
  work="$(mktemp -d)"
  # (No `set -e` here: it does not apply in a subshell whose status `||` tests; each step
  # exits itself.)
  (
    cp -r "$here/cert-manager/controller" "$here/cert-manager/webhook" "$work/" && cd "$work" || exit 1
    go mod init "$CERT_MANAGER_MODULE_PATH" >/dev/null 2>&1 || exit 1
    go mod edit -go="$(awk '$1 == "go" { print $2; exit }' "$dir/go.mod")" || exit 1
    go get "$mod@v$v" >/dev/null 2>&1 || go get "$mod@v$v" || exit 1
    go mod tidy >/dev/null || { log "go mod tidy failed"; exit 1; }
    local pkg="$mod/pkg/util"
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -ldflags "-s -w -X $pkg.AppVersion=v$v -X $pkg.AppGitCommit=v$v" \
      -o "$out/bin.tmp/" ./controller ./webhook 2>&1 | tee build.log | progress "cert-manager v$v"
    # (-v prints one package path a line; the compiler's errors are the other lines.)
    [[ "${PIPESTATUS[0]}" == 0 ]] || { grep -E '^#|\.go:[0-9]+' build.log >&2; exit 1; }
    local b
    for b in controller webhook; do
      "$out/bin.tmp/$b" --version | grep "^v$v$" >/dev/null || { log "cert-manager $b: the binary does not report v$v"; exit 1; }
    done
    local f
    : > "$out/bin.tmp/crds.yaml"
    for f in $(cd "$dir/deploy/crds" && LC_ALL=C ls ./*.yaml); do
      { printf -- '---\n# %s from %s@v%s\n' "${f#./}" "$mod" "$v"; sed '/^---$/d' "$dir/deploy/crds/$f"; } >> "$out/bin.tmp/crds.yaml" || exit 1
    done
    [[ "$(grep -c '^kind: CustomResourceDefinition$' "$out/bin.tmp/crds.yaml")" == 6 ]] || { log "cert-manager v$v: expected 6 CRDs in deploy/crds"; exit 1; }
  ) || { rm -rf "$work" "$out/bin.tmp"; log "cert-manager v$v build failed"; return 1; }
  rm -rf "$work" "$out/bin" "$out/crds.yaml"
  mv "$out/bin.tmp/crds.yaml" "$out/crds.yaml"; mv "$out/bin.tmp" "$out/bin"
  echo "$sum" > "$out/.source"; touch "$out/.complete"
}

# Both majors the chart supports: Helm 3 (HELM_VERSION) and Helm 4 (HELM4_VERSION).
build_helm() {
  build_helm_major 3 "$HELM_VERSION"
  build_helm_major 4 "$HELM4_VERSION"
}

only="${ONLY:-all}"
case "$only" in all|etcd|demo) build_etcd "$APISERVER_ETCD_VERSION" ;; esac
case "$only" in all|kubernetes|demo) build_kubernetes ;; esac
if [[ "$only" == demo ]]; then
  # The etcd the users' example asks for (3.2.13: from its source archive).
  example_version="$(sed -n 's/^ *version: *"\{0,1\}v\{0,1\}\([0-9][0-9.]*\)"\{0,1\} *$/\1/p' "$here/../examples/example-etcd-cluster.yaml" | head -1)"
  case " $ETCD_SOURCE_VERSIONS " in
    *" $example_version "*) build_etcd_source "$example_version" ;;
    *) build_etcd "$example_version" ;;
  esac
  build_helm_major 3 "$HELM_VERSION"
fi
case "$only" in all|etcd) for v in $APISERVER_ETCD_VERSION $ETCD_VERSIONS; do build_etcd "$v"; build_etcdutl "$v"; done ;; esac
case "$only" in all|etcd|etcd-source) for v in $ETCD_SOURCE_VERSIONS; do build_etcd_source "$v"; done ;; esac
case "$only" in all|helm) build_helm ;; esac
case "$only" in all|s3) build_versitygw ;; esac
case "$only" in all|abs) install_azurite ;; esac
case "$only" in all|gcs) build_fake_gcs_server ;; esac
case "$only" in all|prometheus) build_prometheus ;; esac
case "$only" in all|node) build_node; build_coredns ;; esac
case "$only" in all|node|netpol) build_netpol ;; esac
case "$only" in all|porcupine) fetch_porcupine ;; esac
case "$only" in all|clientv3) build_clientv3_load ;; esac
case "$only" in all|cert-manager) build_cert_manager ;; esac

if [[ "$mode" == "--check" ]]; then exit "$missing"; fi
log "tools in $TOOLS:"
# With ONLY=... some tools may not be built yet: print those that are.
show() { if [[ -x "$1" ]]; then "$@" 2>/dev/null | sed -n 1p >&2; else log "not built: $1"; fi; }
show "$TOOLS/kubernetes/v$KUBERNETES_VERSION/bin/kube-apiserver" --version
show "$TOOLS/kubernetes/v$KUBERNETES_VERSION/bin/kubectl" version --client
for v in $ETCD_SOURCE_VERSIONS $ETCD_VERSIONS; do show "$TOOLS/etcd/v$v/bin/etcd" --version; done
for v in "$HELM_VERSION" "$HELM4_VERSION"; do show "$TOOLS/helm/v$v/bin/helm" version --short; done
for v in $ETCD_VERSIONS; do show "$TOOLS/etcd/v$v/bin/etcdutl" version; done
[[ -x "$TOOLS/versitygw/v$VERSITYGW_VERSION/bin/versitygw" ]] && log "versitygw v$VERSITYGW_VERSION" || log "not built: versitygw"
[[ -x "$TOOLS/azurite/v$AZURITE_VERSION/bin/azurite-blob" ]] && log "azurite v$AZURITE_VERSION" || log "not built: azurite"
[[ -x "$TOOLS/fake-gcs-server/v$FAKE_GCS_SERVER_VERSION/bin/fake-gcs-server" ]] && log "fake-gcs-server v$FAKE_GCS_SERVER_VERSION" || log "not built: fake-gcs-server"
show "$TOOLS/prometheus/v$PROMETHEUS_VERSION/bin/promtool" --version
node_bin="$TOOLS/node/v$KUBERNETES_VERSION-containerd$CONTAINERD_VERSION-cni$CNI_PLUGINS_VERSION/bin"
show "$node_bin/kubelet" --version
show "$node_bin/containerd" --version
show "$TOOLS/coredns/v$COREDNS_VERSION/bin/coredns" -version
[[ -x "$TOOLS/kube-network-policies/v$KUBE_NETWORK_POLICIES_VERSION/bin/kube-network-policies" ]] && log "kube-network-policies v$KUBE_NETWORK_POLICIES_VERSION" || log "not built: kube-network-policies"
[[ -f "$TOOLS/porcupine/v$PORCUPINE_VERSION/.complete" ]] && log "porcupine v$PORCUPINE_VERSION test data" || log "not fetched: porcupine"
[[ -f "$(clientv3_load_dir)/.complete" ]] && log "clientv3-load $(basename "$(clientv3_load_dir)")" || log "not built: clientv3-load"
show "$TOOLS/cert-manager/v$CERT_MANAGER_VERSION/bin/controller" --version
