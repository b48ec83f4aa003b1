#!/usr/bin/env bash
# The local demo: builds what is missing, then starts a real control plane and the process
# kubelet on this machine, installs the operator with `helm install` of charts/etcd-operator,
# applies examples/example-etcd-cluster.yaml, waits until it is Available and keeps running.
#
#   hack/demo.sh [up] [demo flags...]   start (Ctrl-C stops it); `--help` lists the flags
#   hack/demo.sh --cert-manager         also cert-manager and a CA Issuer etcd-ca
#   hack/demo.sh --real-node            the same on a real node (kubelet, containerd, runc,
#                                       CoreDNS) from the images of hack/build-images.sh (root)
#   hack/demo.sh down                   stop a demo running in another shell
#
# Needs: Go and Rust toolchains, protoc, iproute2 and util-linux (hack/check-prereqs.sh demo
# checks them first and prints the command that installs what is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
state_dir="${ETCD_OPERATOR_DEMO_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/etcd-operator-demo}"
export ETCD_OPERATOR_DEMO_DIR="$state_dir"

case "${1:-up}" in
  down)
    pid_file="$state_dir/demo.pid"
    if [[ ! -s "$pid_file" ]]; then
      echo "demo: no running demo ($pid_file not found)" >&2
      exit 1
    fi
    pid="$(cat "$pid_file")"
    if ! kill -TERM "$pid" 2>/dev/null; then
      echo "demo: process $pid is gone; removing the stale $pid_file" >&2
      rm -f "$pid_file"
      exit 0
    fi
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    echo "demo: stopped (pid $pid)"
    ;;
  up | -*)
    if [[ "${1:-}" == up ]]; then shift; fi
    real_node=0 cert_manager=0
    for arg in "$@"; do
      if [[ "$arg" == --real-node ]]; then real_node=1; fi
      if [[ "$arg" == --cert-manager ]]; then cert_manager=1; fi
    done
    # What the machine lacks is said now, with the command that installs it.
    hack/check-prereqs.sh demo
    if ((real_node)); then hack/check-prereqs.sh images && hack/check-prereqs.sh node; fi
    echo "==> building the pinned Go tools the demo runs that are missing (Kubernetes, two etcd versions, Helm 3)"
    ONLY=demo hack/build-tools.sh
    if ((cert_manager)); then
      echo "==> building cert-manager if missing (its controller, webhook and CRDs; about 8 min the first time)"
      ONLY=cert-manager hack/build-tools.sh
    fi
    if ((real_node)); then
      echo "==> building the real node's tools that are missing (kubelet, kube-proxy, containerd, CNI plugins, CoreDNS)"
      ONLY=node hack/build-tools.sh
      example_version="$(sed -n 's/^ *version: *"\{0,1\}v\{0,1\}\([0-9][0-9.]*\)"\{0,1\} *$/\1/p' examples/example-etcd-cluster.yaml | head -1)"
      echo "==> building the images the real node imports (release build, then controller, webhook, pause, CoreDNS, etcd $example_version)"
      IMAGES="controller webhook pause coredns etcd-$example_version" hack/build-images.sh
    fi
    echo "==> building the operator and the demo (cargo build)"
    # The operator's two binaries (the kubelet runs the chart's pods from them) and the demo;
    # `--bin` applies to every package named, so each package gets its own.
    cargo build -p etcd-controller --bin etcd-controller -p etcd-webhook --bin etcd-webhook -p etcd-tests --bin demo
    exec target/debug/demo "$@"
    ;;
  *)
    echo "usage: hack/demo.sh [up [flags...] | down]" >&2
    exit 2
    ;;
esac
