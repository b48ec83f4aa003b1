#!/usr/bin/env bash
# Measures, on the real etcd binaries, which TLS files a running member re-reads when they are
# replaced on disk without a restart, and prints one row per etcd line:
#
#   hack/measure-tls-reload.sh                all six lines: 3.2.13 3.3.27 3.4.45 3.5.35 3.6.16 3.7.3
#   hack/measure-tls-reload.sh 3.2.13 3.6.16  only those lines (about 15 s each)
#
# Columns (yes = the running member used the new file on the next handshake):
#   server leaf   --cert-file/--key-file: a new client-port handshake presents the new certificate,
#                 both without SNI (a client dialing an IP address) and with SNI "localhost";
#                 "SNI-only" when only handshakes that carry a server name get it
#   peer leaf     --peer-cert-file/--peer-key-file: a new handshake on the peer port presents it
#                 (same SNI distinction)
#   client CA     --trusted-ca-file (--client-cert-auth): a client certificate of a second CA is
#                 accepted once the file holds both CAs, and one of the first CA refused once it
#                 holds only the second ("add"/"remove" when only one of the two took effect)
#   peer CA       the same with --peer-trusted-ca-file (--peer-client-cert-auth) on the peer port
#   peer dial     the member's own outgoing peer connections present the new --peer-cert-file as
#                 their client certificate (seen by a fake second member, a Python TLS server)
#
# Each line runs twice, once per way of replacing the files:
#   symlink   as the kubelet updates a Secret volume: every name is a symlink into `..data`,
#             itself a symlink to a timestamped directory; a new directory is written and
#             `..data` renamed over atomically, the old directory removed
#   inplace   the regular files overwritten in place (truncate + write)
# and a row is printed per mode when they differ (one row "both" otherwise).
#
# How: one single-member cluster per line and mode with client and peer TLS and client
# certificate auth on both ports, certificates from two throwaway OpenSSL CAs (EC P-256, SANs
# DNS:localhost and IP:127.0.0.1). Leaves are told apart by their CN, read from
# `openssl s_client` (no SNI: clients that dial an IP send none); acceptance of a client
# certificate is a curl of /version (exit 0 = the handshake was accepted). After each swap the
# probes are repeated for up to RELOAD_WAIT seconds (default 3). Also printed ("notes"):
# whether a member starts, and what it serves, with an expired server or peer certificate, and
# etcd's log lines about certificates other than the refusals the probes cause.
# tests/tests/etcd_tls_reload.rs asserts the client-port columns per line.
#
# Needs openssl, curl and python3 (the fake peer), and the binaries in ETCD_TOOLS (default
# ~/.cache/etcd-operator/tools/etcd, from hack/build-tools.sh). Ports BASE_PORT.. (default
# 23000, 10 per line). The lines run side by side, JOBS (default 3) at a time. Everything runs
# in a temporary directory; every process started here is killed on exit. KEEP=1 keeps the
# directory (etcd logs in WORK/LINE-MODE/etcd.log).
set -Eeuo pipefail

TOOLS="${ETCD_TOOLS:-$HOME/.cache/etcd-operator/tools/etcd}"
BASE_PORT="${BASE_PORT:-23000}"
RELOAD_WAIT="${RELOAD_WAIT:-3}"
ALL_LINES=(3.2.13 3.3.27 3.4.45 3.5.35 3.6.16 3.7.3)
if (($# > 0)); then LINES=("$@"); else LINES=("${ALL_LINES[@]}"); fi

for tool in openssl curl python3; do
  command -v "$tool" >/dev/null || {
    echo "$tool is missing (apt-get install -y $tool)" >&2
    exit 1
  }
done
for line in "${LINES[@]}"; do
  [[ -x "$TOOLS/v$line/bin/etcd" ]] || {
    echo "no etcd $line in $TOOLS/v$line/bin (hack/build-tools.sh)" >&2
    exit 1
  }
done

WORK="$(mktemp -d /tmp/measure-tls-reload.XXXXXX)"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [[ "${KEEP:-0}" == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'echo "$0: failed at line $LINENO" >&2' ERR

# Stops one process started here (by its pid) and forgets it.
stop() {
  local pid="$1" keep=() p
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [[ "$p" == "$pid" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

# ---------------------------------------------------------------------------------------------
# PKI: two CAs; leaves named by their CN.
PKI="$WORK/pki"
mkdir -p "$PKI"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$PKI/$1.key" -subj "/CN=$1" -days 2 -out "$PKI/$1.crt" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
# leaf NAME CA EKU [expired]: CN=NAME, SANs localhost and 127.0.0.1.
leaf() {
  local name="$1" ca="$2" eku="$3" expired="${4:-}"
  key "$name"
  openssl req -new -key "$PKI/$name.key" -subj "/CN=$name" -out "$PKI/$name.csr"
  cat >"$PKI/$name.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku
subjectAltName=DNS:localhost,IP:127.0.0.1
EOF
  if [[ -z "$expired" ]]; then
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
      -CAcreateserial -days 2 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  else
    # `openssl ca` is the one that takes explicit dates: valid for one day, a year ago.
    local db="$PKI/ca-db"
    mkdir -p "$db"
    : >"$db/index.txt"
    [[ -f "$db/serial" ]] || echo 1000 >"$db/serial"
    cat >"$db/ca.cnf" <<EOF
[ca]
default_ca = d
[d]
database = $db/index.txt
new_certs_dir = $db
serial = $db/serial
default_md = sha256
policy = p
unique_subject = no
[p]
commonName = supplied
EOF
    local start end
    start="$(date -u -d '1 year ago' +%Y%m%d%H%M%SZ)"
    end="$(date -u -d '1 year ago + 1 day' +%Y%m%d%H%M%SZ)"
    openssl ca -batch -config "$db/ca.cnf" -cert "$PKI/$ca.crt" -keyfile "$PKI/$ca.key" \
      -startdate "$start" -enddate "$end" -extfile "$PKI/$name.ext" -in "$PKI/$name.csr" \
      -out "$PKI/$name.crt" -notext 2>/dev/null
  fi
}
ca ca1
ca ca2
cat "$PKI/ca1.crt" "$PKI/ca2.crt" >"$PKI/ca12.crt"
leaf server-old ca1 serverAuth,clientAuth
leaf server-new ca1 serverAuth,clientAuth
leaf peer-old ca1 serverAuth,clientAuth
leaf peer-new ca1 serverAuth,clientAuth
leaf client-ca1 ca1 clientAuth
leaf client-ca2 ca2 clientAuth
leaf fake-peer ca1 serverAuth
leaf server-expired ca1 serverAuth,clientAuth expired
leaf peer-expired ca1 serverAuth,clientAuth expired

# ---------------------------------------------------------------------------------------------
# The member's certificate directory. Generations are (server leaf, peer leaf, client CA file,
# peer CA file); FILES are the names etcd is given.
FILES=(server.crt server.key peer.crt peer.key ca.crt peer-ca.crt)
GEN=0

# contents DIR SERVER PEER CA PEERCA: writes the six files into DIR.
contents() {
  local dir="$1"
  cp "$PKI/$2.crt" "$dir/server.crt"
  cp "$PKI/$2.key" "$dir/server.key"
  cp "$PKI/$3.crt" "$dir/peer.crt"
  cp "$PKI/$3.key" "$dir/peer.key"
  cp "$PKI/$4.crt" "$dir/ca.crt"
  cp "$PKI/$5.crt" "$dir/peer-ca.crt"
}

# publish MODE DIR SERVER PEER CA PEERCA
publish() {
  local mode="$1" dir="$2"
  shift 2
  GEN=$((GEN + 1))
  if [[ "$mode" == symlink ]]; then
    # The kubelet's AtomicWriter: ..TIMESTAMP/, ..data -> ..TIMESTAMP, NAME -> ..data/NAME.
    local ts old="" f
    ts="..$(date -u +%Y_%m_%d_%H_%M_%S).$GEN"
    mkdir "$dir/$ts"
    contents "$dir/$ts" "$@"
    if [[ -L "$dir/..data" ]]; then old="$(readlink "$dir/..data")"; fi
    ln -s "$ts" "$dir/..data_tmp"
    mv -T "$dir/..data_tmp" "$dir/..data"
    for f in "${FILES[@]}"; do [[ -L "$dir/$f" ]] || ln -s "..data/$f" "$dir/$f"; done
    if [[ -n "$old" ]]; then rm -rf "${dir:?}/$old"; fi
  else
    # Regular files, overwritten in place (same inode: truncate, then write).
    local src="$dir.staging" f
    rm -rf "$src" && mkdir -p "$src"
    contents "$src" "$@"
    for f in "${FILES[@]}"; do cat "$src/$f" >"$dir/$f"; done
  fi
}

# ---------------------------------------------------------------------------------------------
# Probes.

# served_cn PORT CLIENT [SNI]: the CN of the leaf a new handshake on PORT presents, with no SNI
# (as a client dialing an IP address) or the server name SNI.
served_cn() {
  local sni=(-noservername)
  [[ -z "${3:-}" ]] || sni=(-servername "$3")
  openssl s_client -connect "127.0.0.1:$1" "${sni[@]}" -cert "$PKI/$2.crt" \
    -key "$PKI/$2.key" </dev/null 2>/dev/null |
    openssl x509 -noout -subject -nameopt multiline 2>/dev/null |
    sed -n 's/^ *commonName *= *//p'
}

# accepts PORT CLIENT: whether a new handshake on PORT with CLIENT's certificate is accepted.
accepts() {
  curl -sS --http1.1 --max-time 3 --cacert "$PKI/ca1.crt" --cert "$PKI/$2.crt" \
    --key "$PKI/$2.key" \
    -o /dev/null "https://127.0.0.1:$1/version" 2>/dev/null
}

# cn_is PORT CLIENT CN [SNI]
cn_is() { [[ "$(served_cn "$1" "$2" "${4:-}")" == "$3" ]]; }
refuses() { ! accepts "$@"; }
# The client certificates the fake peer saw: their number, the CN of the last.
dials() { grep -c "depth=0 CN = " "$1" || true; }
last_dial_cn() { { grep -o 'depth=0 CN = [^ ]*' "$1" || true; } | tail -1 | sed 's/.*= //'; }

# settle CHECK...: runs the functions check_CHECK until each has passed once or RELOAD_WAIT
# seconds have gone by; OK[CHECK]=yes for those that passed.
declare -A OK
settle() {
  local deadline=$((SECONDS + RELOAD_WAIT)) pending=("$@") left name
  OK=()
  while :; do
    left=()
    for name in "${pending[@]}"; do
      if "check_$name"; then OK[$name]=yes; else left+=("$name"); fi
    done
    ((${#left[@]} > 0 && SECONDS < deadline)) || return 0
    pending=("${left[@]}")
    sleep 0.2
  done
}
# The checks, on the member of CPORT/PPORT: after the first swap (new leaves, CA bundles) ...
check_server() { cn_is "$CPORT" client-ca1 server-new; }
check_peer() { cn_is "$PPORT" client-ca1 peer-new; }
check_server_sni() { cn_is "$CPORT" client-ca1 server-new localhost; }
check_peer_sni() { cn_is "$PPORT" client-ca1 peer-new localhost; }
check_client_ca_add() { accepts "$CPORT" client-ca2; }
check_peer_ca_add() { accepts "$PPORT" client-ca2; }
# ... and after the second (the CA files hold the second CA only).
check_client_ca_remove() { refuses "$CPORT" client-ca1; }
check_peer_ca_remove() { refuses "$PPORT" client-ca1; }

# await_dials LOG N: waits up to 10 s for the fake peer to have seen N client certificates.
await_dials() {
  local deadline=$((SECONDS + 10))
  while (($(dials "$1") < $2 && SECONDS < deadline)); do sleep 0.2; done
  (($(dials "$1") >= $2))
}

# start_member LINE DIR CPORT PPORT: a single-member cluster on the files in DIR/tls; its pid
# in MEMBER_PID.
start_member() {
  local line="$1" dir="$2" cport="$3" pport="$4" t="$2/tls"
  "$TOOLS/v$line/bin/etcd" --name m --data-dir "$dir/data" \
    --listen-client-urls "https://127.0.0.1:$cport" \
    --advertise-client-urls "https://127.0.0.1:$cport" \
    --listen-peer-urls "https://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "https://127.0.0.1:$pport" \
    --initial-cluster "m=https://127.0.0.1:$pport" --initial-cluster-state new \
    --initial-cluster-token "tls-reload-$cport" --strict-reconfig-check=false \
    --cert-file "$t/server.crt" --key-file "$t/server.key" \
    --client-cert-auth --trusted-ca-file "$t/ca.crt" \
    --peer-cert-file "$t/peer.crt" --peer-key-file "$t/peer.key" \
    --peer-client-cert-auth --peer-trusted-ca-file "$t/peer-ca.crt" \
    >"$dir/etcd.log" 2>&1 &
  MEMBER_PID=$!
  PIDS+=("$MEMBER_PID")
}

# ready CPORT CLIENT: /health answers true within 15 s.
ready() {
  local i
  for ((i = 0; i < 75; i++)); do
    if curl -s --max-time 1 --cacert "$PKI/ca1.crt" --cert "$PKI/$2.crt" \
      --key "$PKI/$2.key" "https://127.0.0.1:$1/health" 2>/dev/null | grep -q true; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# measure LINE MODE INDEX: sets RESULT to "server peer clientCA peerCA peerDial".
measure() {
  local line="$1" mode="$2" idx="$3"
  local dir="$WORK/$line-$mode"
  CPORT=$((BASE_PORT + idx * 10))
  PPORT=$((CPORT + 1))
  local fport=$((CPORT + 2))
  mkdir -p "$dir/tls"
  publish "$mode" "$dir/tls" server-old peer-old ca1 ca1
  start_member "$line" "$dir" "$CPORT" "$PPORT"
  local member=$MEMBER_PID
  if ! ready "$CPORT" client-ca1; then
    echo "etcd $line ($mode) did not become healthy; log tail:" >&2
    tail -20 "$dir/etcd.log" >&2
    return 1
  fi
  # Baseline: what the member was started with is served and enforced.
  local base=""
  cn_is "$CPORT" client-ca1 server-old || base+=" server-leaf"
  cn_is "$PPORT" client-ca1 peer-old || base+=" peer-leaf"
  accepts "$CPORT" client-ca1 || base+=" client-ca1-refused"
  refuses "$CPORT" client-ca2 || base+=" client-ca2-accepted"
  accepts "$PPORT" client-ca1 || base+=" peer-ca1-refused"
  refuses "$PPORT" client-ca2 || base+=" peer-ca2-accepted"
  if [[ -n "$base" ]]; then
    echo "etcd $line ($mode): baseline failed:$base" >&2
    return 1
  fi

  # A second member that only records the client certificate of every connection the member
  # opens to it (probes, streams, pipeline), then closes it: the member re-dials every 100 ms.
  local fake_log="$dir/fake-peer.log"
  : >"$fake_log"
  python3 - "$fport" "$PKI" "$fake_log" 2>"$dir/fake-peer.err" <<'PY' &
import socket, ssl, sys, threading
port, pki, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(pki + "/fake-peer.crt", pki + "/fake-peer.key")
ctx.load_verify_locations(pki + "/ca1.crt")
ctx.verify_mode = ssl.CERT_REQUIRED
log = open(path, "a", buffering=1)
def handle(conn):
    try:
        with ctx.wrap_socket(conn, server_side=True) as tls:
            subject = dict(rdn[0] for rdn in tls.getpeercert()["subject"])
            log.write("depth=0 CN = %s\n" % subject["commonName"])
    except (OSError, ValueError) as err:
        log.write("error %s\n" % err)
    finally:
        conn.close()
server = socket.create_server(("127.0.0.1", port))
while True:
    conn, _ = server.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
PY
  local fake=$!
  PIDS+=("$fake")
  ETCDCTL_API=3 "$TOOLS/v$line/bin/etcdctl" --endpoints "https://127.0.0.1:$CPORT" \
    --cacert "$PKI/ca1.crt" --cert "$PKI/client-ca1.crt" --key "$PKI/client-ca1.key" \
    member add fake --peer-urls "https://127.0.0.1:$fport" >/dev/null 2>"$dir/member-add.err" ||
    true
  local dial_base=no
  await_dials "$fake_log" 1 && [[ "$(last_dial_cn "$fake_log")" == peer-old ]] && dial_base=yes

  # 1: new leaves (same CA), both CA files the bundle ca1+ca2.
  publish "$mode" "$dir/tls" server-new peer-new ca12 ca12
  local mark
  mark="$(dials "$fake_log")"
  settle server peer server_sni peer_sni client_ca_add peer_ca_add
  local server peer
  server="$(leaf_cell "${OK[server]:-no}" "${OK[server_sni]:-no}")"
  peer="$(leaf_cell "${OK[peer]:-no}" "${OK[peer_sni]:-no}")"
  local cadd="${OK[client_ca_add]:-no}" padd="${OK[peer_ca_add]:-no}" dial="n/a"
  # Two dials after the swap; the last one tells.
  if [[ "$dial_base" == yes ]] && await_dials "$fake_log" $((mark + 2)); then
    dial=no
    [[ "$(last_dial_cn "$fake_log")" == peer-new ]] && dial=yes
  fi
  stop "$fake"
  # 2: the CA files hold ca2 only.
  publish "$mode" "$dir/tls" server-new peer-new ca2 ca2
  settle client_ca_remove peer_ca_remove
  local cdel="${OK[client_ca_remove]:-no}" pdel="${OK[peer_ca_remove]:-no}"
  stop "$member"
  # Log lines about certificates other than the refusals the probes caused.
  { grep -iE 'certificate|x509|tls:' "$dir/etcd.log" || true; } |
    { grep -viE 'rejected connection|remote error|bad certificate|tls: unknown|cert = ' || true; } |
    sed -E 's/^[0-9/: .-]+//; s/"ts":"[^"]*",//' | cut -c1-200 | sort -u | head -3 |
    sed "s|^|  $line $mode log: |" >>"$NOTES"
  RESULT="$server $peer $(ca_cell "$cadd" "$cdel") $(ca_cell "$padd" "$pdel") $dial"
}
# leaf_cell NO_SNI SNI
leaf_cell() {
  case "$1/$2" in
  yes/yes) echo yes ;; no/no) echo no ;; no/yes) echo SNI-only ;; yes/no) echo no-SNI-only ;;
  esac
}
ca_cell() {
  case "$1/$2" in
  yes/yes) echo yes ;; no/no) echo no ;; yes/no) echo add ;; no/yes) echo remove ;;
  esac
}

# expired_start LINE INDEX WHICH: starts a member whose server (WHICH=server) or peer
# (WHICH=peer) leaf is expired; sets RESULT to what happened.
expired_start() {
  local line="$1" idx="$2" which="$3"
  local dir="$WORK/$line-expired-$which" cport=$((BASE_PORT + idx * 10 + 5))
  local pport=$((cport + 1))
  mkdir -p "$dir/tls"
  if [[ "$which" == server ]]; then
    publish inplace "$dir/tls" server-expired peer-old ca1 ca1
  else
    publish inplace "$dir/tls" server-old peer-expired ca1 ca1
  fi
  start_member "$line" "$dir" "$cport" "$pport"
  local pid=$MEMBER_PID state i port=$cport
  [[ "$which" == server ]] || port=$pport
  for ((i = 0; i < 15; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    [[ -n "$(served_cn "$port" client-ca1)" ]] && break
    sleep 0.2
  done
  if ! kill -0 "$pid" 2>/dev/null; then
    state="exits: $(grep -iE 'expired|x509|certificate' "$dir/etcd.log" | tail -1 | cut -c1-160)"
  else
    local cn
    cn="$(served_cn "$port" client-ca1)"
    state="runs, serves ${cn:-nothing}"
  fi
  stop "$pid"
  RESULT="$state"
}

# ---------------------------------------------------------------------------------------------
row() {
  printf '%-8s | %-7s | %-18s | %-16s | %-16s | %-14s | %s\n' "$@"
}

# run_line LINE INDEX: the rows of LINE into WORK/rows.INDEX, its notes into WORK/notes.INDEX.
# Runs in a subshell (a lane) that stops its own processes when it ends or is stopped.
run_line() {
  local line="$1" idx="$2" sym inp
  PIDS=()
  NOTES="$WORK/notes.$idx"
  trap cleanup_lane EXIT
  trap 'exit 143' TERM INT
  measure "$line" symlink "$idx"
  sym="$RESULT"
  measure "$line" inplace "$idx"
  inp="$RESULT"
  # shellcheck disable=SC2086 # the five cells
  if [[ "$sym" == "$inp" ]]; then
    row "$line" both $sym >"$WORK/rows.$idx.tmp"
  else
    { row "$line" symlink $sym && row "$line" inplace $inp; } >"$WORK/rows.$idx.tmp"
  fi
  expired_start "$line" "$idx" server
  echo "  $line: started with an expired server leaf: $RESULT" >>"$NOTES"
  expired_start "$line" "$idx" peer
  echo "  $line: started with an expired peer leaf: $RESULT" >>"$NOTES"
  mv "$WORK/rows.$idx.tmp" "$WORK/rows.$idx"
}
cleanup_lane() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# The lines side by side, JOBS (default 3) at a time: most of the time is spent waiting.
JOBS="${JOBS:-3}"
idx=0
for line in "${LINES[@]}"; do
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
  run_line "$line" "$idx" &
  PIDS+=("$!")
  idx=$((idx + 1))
done
for pid in "${PIDS[@]}"; do wait "$pid" || true; done
PIDS=()

row line mode "server leaf reload" "peer leaf reload" "client CA reload" "peer CA reload" \
  "peer dial reload"
failed=0
for ((i = 0; i < ${#LINES[@]}; i++)); do
  if [[ -f "$WORK/rows.$i" ]]; then cat "$WORK/rows.$i"; else
    row "${LINES[i]}" failed "(see above)" "" "" "" ""
    failed=1
  fi
done
echo "notes:"
for ((i = 0; i < ${#LINES[@]}; i++)); do
  [[ ! -f "$WORK/notes.$i" ]] || cat "$WORK/notes.$i"
done
exit "$failed"
