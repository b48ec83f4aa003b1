#!/usr/bin/env bash
# Builds the pinned Go tools (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd + etcdctl at several versions, helm) from the Go module proxy into a cache outside the
# repo, keyed by version. Idempotent: a warm cache costs well under a second per tool.
#
#   hack/build-tools.sh            build whatever is missing, then print each tool's version
#   hack/build-tools.sh --check    exit 1 (building nothing) when something is missing
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

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Prints a line every 100 packages compiled, so long builds show progress.
progress() {
  awk -v what="$1" '{ n++; if (n % 100 == 0) { printf("[build-tools] %s: %d packages compiled\n", what, n) > "/dev/stderr"; fflush("/dev/stderr") } }
    END { printf("[build-tools] %s: %d packages compiled in all\n", what, n) > "/dev/stderr" }'
}

missing=0
need() { # need DIR: true when DIR has no completed build
  if [[ -f "$1/.complete" ]]; then return 1; fi
  if [[ "$mode" == "--check" ]]; then log "missing: $1"; missing=1; return 1; fi
  return 0
}

build_kubernetes() {
  local v="$KUBERNETES_VERSION" out="$TOOLS/kubernetes/v$KUBERNETES_VERSION"
  need "$out" || return 0
  log "building Kubernetes v$v (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl); first build takes 20-40 min on 2 cores"
  local work; work="$(mktemp -d)"
  (
    cd "$work"
    go mod init k8sbuild >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@v$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
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
	_ "go.etcd.io/etcd/server/v3"
)
GO
    go get "go.etcd.io/etcd/server/v3@v$v" "go.etcd.io/etcd/etcdctl/v3@v$v" >/dev/null 2>&1 ||
      go get "go.etcd.io/etcd/server/v3@v$v" "go.etcd.io/etcd/etcdctl/v3@v$v"
    go mod tidy -e >/dev/null
    mkdir -p "$out/bin.tmp"
    go build -v -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcd" go.etcd.io/etcd/server/v3 2>&1 | progress "etcd v$v"
    [[ "${PIPESTATUS[0]}" == 0 ]] || exit 1
    go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3
  ) || { rm -rf "$work" "$out/bin.tmp"; log "etcd v$v build failed"; return 1; }
  rm -rf "$work" "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

build_helm() {
  local v="$HELM_VERSION" out="$TOOLS/helm/v$HELM_VERSION"
  need "$out" || return 0
  log "building helm v$v"
  mkdir -p "$out/bin.tmp"
  GOBIN="$out/bin.tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@v$v" || { rm -rf "$out/bin.tmp"; log "helm build failed"; return 1; }
  rm -rf "$out/bin"; mv "$out/bin.tmp" "$out/bin"; touch "$out/.complete"
}

only="${ONLY:-all}"
case "$only" in all|etcd) build_etcd "$APISERVER_ETCD_VERSION" ;; esac
case "$only" in all|kubernetes) build_kubernetes ;; esac
case "$only" in all|etcd) for v in $ETCD_VERSIONS; do build_etcd "$v"; done ;; esac
case "$only" in all|helm) build_helm ;; esac

if [[ "$mode" == "--check" ]]; then exit "$missing"; fi
log "tools in $TOOLS:"
"$TOOLS/kubernetes/v$KUBERNETES_VERSION/bin/kube-apiserver" --version >&2
"$TOOLS/kubernetes/v$KUBERNETES_VERSION/bin/kubectl" version --client 2>/dev/null | sed -n 1p >&2
for v in $ETCD_VERSIONS; do "$TOOLS/etcd/v$v/bin/etcd" --version | sed -n 1p >&2; done
"$TOOLS/helm/v$HELM_VERSION/bin/helm" version --short >&2
