#!/usr/bin/env bash
# The project's test command: every test `cargo test --workspace --locked` runs, with the
# integration suites run side by side instead of one after another.
#
#   hack/test.sh              build every test target, run the unit and doc tests, then the
#                             suites, ETCD_TEST_JOBS (default 4) lanes at a time
#   hack/test.sh SUITE...     only those integration suites (by test target name)
#
# Each suite is its own process with its own control plane, network namespace and ports, so
# suites do not share anything but the machine; most of their time is waiting on etcd and
# Kubernetes timers, so two lanes on two cores take about half the time of one. The suites whose
# faults depend on timing (node heartbeats, eviction timers, a real node's kubelet and
# containerd) run one after another in a lane of their own, longest first. Every suite's output
# goes to target/test-logs/SUITE.log; a failed suite's tail is printed. Exits 1 when anything
# failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS="${ETCD_TEST_JOBS:-4}"
LOGS="$PWD/target/test-logs"
mkdir -p "$LOGS"
start=$SECONDS

# Suites that share timing-sensitive faults: one after another, in one lane.
SERIAL=(safety_nodes robustness nodes real_node_chart real_node network_policies images)
# The others, longest first (measured on the 2-core CI machine; a new suite goes last).
ORDER=(managed_tls day2 lifecycle backup_restore coreos_takeover safety recovery clients
  failpoints prometheus chart_install chart_rbac installed backup_pvc leader_election
  chart_render etcd_lines kubelet reconcile etcd_tls server control_plane recorder
  object_stores on_apiserver clientv3 coreos_clients snapshots fuzz etcd_tls_reload cert_manager)

log() { printf '[test %4ds] %s\n' "$((SECONDS - start))" "$*"; }

log "building every test target"
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics \
  >"$LOGS/artifacts.json"
# name<TAB>executable<TAB>package directory, for every integration test target.
perl -MJSON::PP -ne '
  my $m = eval { decode_json($_) } or next;
  next unless ($m->{reason} // "") eq "compiler-artifact" && $m->{executable} && $m->{profile}{test};
  next unless $m->{target}{kind}[0] eq "test";
  (my $dir = $m->{manifest_path}) =~ s{/Cargo\.toml$}{};
  print join("\t", $m->{target}{name}, $m->{executable}, $dir), "\n";
' "$LOGS/artifacts.json" | sort -u >"$LOGS/suites.tsv"

if (($# == 0)); then
  log "unit tests"
  cargo test --workspace --locked --lib --bins
  log "doc tests"
  cargo test --workspace --locked --doc
fi

# Runs the suites named in "$@" one after another; prints one line per suite.
run_serially() {
  local name exe dir rc failed=0
  for name in "$@"; do
    while IFS=$'\t' read -r n exe dir; do
      [[ "$n" == "$name" ]] || continue
      local begin=$SECONDS
      set +e
      (cd "$dir" && "$exe") >"$LOGS/$n-$(basename "$exe").log" 2>&1
      rc=$?
      set -e
      local summary
      summary="$(grep -h '^test result' "$LOGS/$n-$(basename "$exe").log" | tail -1)"
      printf '[suite %s] %s (%ds, exit %d)\n' "$n" "${summary:-no summary}" "$((SECONDS - begin))" "$rc"
      if ((rc != 0)); then
        failed=1
        printf -- '----- last 80 lines of %s -----\n' "$LOGS/$n-$(basename "$exe").log"
        tail -n 80 "$LOGS/$n-$(basename "$exe").log"
      fi
    done <"$LOGS/suites.tsv"
  done
  return "$failed"
}
export -f run_serially
export LOGS

# Every integration suite name, in the order chosen above, then any not listed.
mapfile -t all < <(cut -f1 "$LOGS/suites.tsv" | sort -u)
if (($# > 0)); then
  wanted=("$@")
else
  wanted=("${all[@]}")
fi
contains() { local x; for x in "${@:2}"; do [[ "$x" == "$1" ]] && return 0; done; return 1; }
serial=() parallel=()
for name in "${SERIAL[@]}"; do contains "$name" "${wanted[@]}" && serial+=("$name"); done
for name in "${ORDER[@]}"; do
  contains "$name" "${wanted[@]}" && ! contains "$name" "${SERIAL[@]}" && parallel+=("$name")
done
for name in "${wanted[@]}"; do
  contains "$name" "${SERIAL[@]}" "${ORDER[@]}" || parallel+=("$name")
done

log "suites: ${#serial[@]} in one lane (${serial[*]:-none}), ${#parallel[@]} over $((JOBS > 1 ? JOBS - 1 : 1)) more"
status=0
if ((JOBS > 1)); then
  run_serially "${serial[@]}" &
  serial_pid=$!
  if ((${#parallel[@]})); then
    printf '%s\n' "${parallel[@]}" |
      xargs -P "$((JOBS - 1))" -I{} bash -c 'run_serially "$@"' _ {} || status=1
  fi
  wait "$serial_pid" || status=1
else
  run_serially "${serial[@]}" "${parallel[@]}" || status=1
fi
# Tests that passed close to their timeout (the harness says so): they fail on a slower machine.
find "$LOGS" -name '*.log' -newer "$LOGS/suites.tsv" -exec grep -h '^etcd-tests: .* of its .* timeout' {} + || true
log "done: $([[ $status == 0 ]] && echo "every suite passed" || echo "FAILED")"
exit "$status"
