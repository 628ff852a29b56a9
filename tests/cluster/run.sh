#!/usr/bin/env bash
# Relays past one machine, end to end, in one command: HAProxy (consistent hash of the
# environment id, /readyz checks) in front of relays joined by nats-server (the directory),
# two exec servers and clients through HAProxy, all on loopback, every part from Debian's
# packages (installed here when missing) and this workspace's binaries.
#
#   bash tests/cluster/run.sh        # exits non-zero on the first failed check
#
# Scenarios (each prints `ok - …` or `not ok - …`):
#   1. affinity: environment and client links of one id land on one relay (no lookup, no
#      forwarding anywhere);
#   2. a forced misroute (a client sent straight to another relay): the command works through
#      the relay-to-relay link, output exact, and no plaintext crosses the relay-to-relay hop;
#   3. nats-server stopped: affine traffic works, a misroute fails fast with
#      `directory_unavailable`, and misroutes work again once it is back;
#   4. a relay added: the environment that now hashes to it moves there (at the bounded rate),
#      a command running across the move loses no output, and then nothing is forwarded;
#   5. a relay killed (SIGKILL): its environment re-dials through HAProxy to another relay and
#      a command running across it resumes with 0 bytes lost;
#   6. 1,000 streams across the cluster (through HAProxy and misrouted), every output exact.
#
# Every process it starts is stopped on exit (success, failure or signal).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

# ---- packages and binaries -----------------------------------------------------------------
need=()
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need+=(nats-server)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ "${#need[@]}" -gt 0 ]; then
    echo "# installing ${need[*]} (Debian packages)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi
export PATH="$PATH:/usr/sbin:/sbin"
echo "# $(haproxy -v | head -1); nats-server $(nats-server --version 2>&1 | tr -d '\n')"

cargo build --locked -q -p execrelay -p execrelay-relay --bins
BIN=$ROOT/target/debug
EXECRELAY=$BIN/execrelay
RELAY=$BIN/execrelay-relay
HELPER="python3 $ROOT/tests/cluster/helper.py"

# ---- cleanup ------------------------------------------------------------------------------
WORK=$(mktemp -d /tmp/execrelay-cluster.XXXXXX)
declare -A PIDS=()
cleanup() {
    local code=$?
    for name in "${!PIDS[@]}"; do
        kill -TERM "${PIDS[$name]}" 2>/dev/null || true
    done
    sleep 0.2
    for name in "${!PIDS[@]}"; do
        kill -KILL "${PIDS[$name]}" 2>/dev/null || true
        wait "${PIDS[$name]}" 2>/dev/null || true
    done
    if [ "$code" -ne 0 ]; then
        echo "# logs kept in $WORK"
        for f in "$WORK"/*.log; do
            echo "# ---- $(basename "$f") (last 15 lines)"
            tail -n 15 "$f" | sed 's/^/#   /'
        done
    else
        rm -rf "$WORK"
    fi
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PASSED=0
FAILED=0
ok() { echo "ok - $*"; PASSED=$((PASSED + 1)); }
fail() {
    echo "not ok - $*"
    FAILED=$((FAILED + 1))
    echo "$PASSED passed, $FAILED failed"
    exit 1
}

# Poll `cmd` until it succeeds, at most $1 seconds (a hang guard, not a synchronisation).
until_ok() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            fail "$what (not within ${limit}s)"
        fi
        sleep 0.1
    done
}

# ---- ports, keys, files --------------------------------------------------------------------
mapfile -t P < <($HELPER ports 15)
HAPROXY_PORT=${P[0]}
NATS_PORT=${P[1]}
declare -A LISTEN=([relay-1]=${P[2]} [relay-2]=${P[3]} [relay-3]=${P[4]} [relay-4]=${P[5]})
declare -A METRICS=([relay-1]=${P[6]} [relay-2]=${P[7]} [relay-3]=${P[8]} [relay-4]=${P[9]})
declare -A ADVERTISE=([relay-1]=${P[10]} [relay-2]=${P[11]} [relay-3]=${P[12]} [relay-4]=${P[13]})
RELAYS=(relay-1 relay-2 relay-3 relay-4)
FRONT=127.0.0.1:$HAPROXY_PORT

cd "$WORK"
# One key environments pin, shared by every relay behind the front; one node key per relay
# for relay-to-relay links, listed in the cluster keys file.
$RELAY keygen -o relay -c cluster >/dev/null
: >cluster-keys
for r in "${RELAYS[@]}"; do
    $RELAY keygen -o "node-$r" -c "$r" >/dev/null
    echo "$r $(cat "node-$r.pub")" >>cluster-keys
done
$EXECRELAY keygen -o client -c client >/dev/null 2>&1
cp client.pub authorized_keys

# ---- services ------------------------------------------------------------------------------
start_nats() {
    nats-server -a 127.0.0.1 -p "$NATS_PORT" >>nats.log 2>&1 &
    PIDS[nats]=$!
    until_ok 20 "nats-server up" bash -c "exec 3<>/dev/tcp/127.0.0.1/$NATS_PORT"
}

start_relay() {
    local r=$1
    if [ -z "${PIDS[tee-$r]:-}" ]; then
        # The relay's advertised address is a recording proxy: every byte of relay-to-relay
        # links to this relay is kept, to check that no plaintext crosses the hop.
        $HELPER tee "127.0.0.1:${ADVERTISE[$r]}" "127.0.0.1:${LISTEN[$r]}" "hop-$r.bin" \
            >>"tee-$r.log" 2>&1 &
        PIDS[tee-$r]=$!
    fi
    RUST_LOG=info $RELAY --listen "ws://127.0.0.1:${LISTEN[$r]}" --key relay \
        --environments environments --metrics-listen "127.0.0.1:${METRICS[$r]}" \
        --cluster "nats://127.0.0.1:$NATS_PORT" --node-id "$r" \
        --advertise "ws://127.0.0.1:${ADVERTISE[$r]}" --cluster-keys cluster-keys \
        --node-key "node-$r" --move-min-link-age-ms 1000 --moves-per-second 5 \
        --trusted-front 127.0.0.1 \
        >>"$r.out" 2>>"$r.log" &
    PIDS[$r]=$!
    until_ok 30 "$r up" curl -fsS "http://127.0.0.1:${METRICS[$r]}/readyz"
}

metric() { $HELPER metric "127.0.0.1:${METRICS[$1]}" "$2"; }
relay_of() { $HELPER relay-of "$FRONT" "$1"; }

start_env() {
    local id=$1
    $EXECRELAY keygen -o "server-$id" -c "$id" >/dev/null 2>&1
    echo "$id $(cat "server-$id.pub")" >>environments
}

serve_env() {
    local id=$1
    $EXECRELAY serve --relay "ws://$FRONT" --environment-id "$id" --relay-key relay.pub \
        --key "server-$id" --authorized-keys authorized_keys \
        --relay-backoff-initial-ms 100 --relay-backoff-max-ms 500 \
        >>"server-$id.out" 2>>"server-$id.log" &
    PIDS[server-$id]=$!
}

# run TARGET_URL ID COMMAND… : the command's stdout on stdout, its status as ours.
run() {
    local url=$1 id=$2
    shift 2
    $EXECRELAY run "$url" --server-key "server-$id.pub" --key client -- "$@"
}
via_front() { echo "relay+ws://$FRONT/$1"; }
direct() { echo "relay+ws://127.0.0.1:${LISTEN[$1]}/$2"; }

write_haproxy() {
    cat >haproxy.cfg <<EOF
global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout tunnel 1h
    timeout check 1s
frontend front
    bind $FRONT
    # The environment id is the path's fourth field: /v1/env/ID and /v1/connect/ID alike.
    http-request set-header X-Execrelay-Env %[path,field(4,/)]
    # Tells a relay that this client came through the front (moving home).
    http-request set-header X-Execrelay-Front 1
    default_backend relays
backend relays
    # The address the relays see HAProxy at, and trust its header from (--trusted-front).
    source 127.0.0.1
    balance hdr(X-Execrelay-Env)
    hash-type consistent
    option httpchk GET /readyz
    http-check expect status 200
    http-response set-header X-Execrelay-Relay %[srv_name]
    default-server check inter 300 fall 2 rise 1
EOF
    for r in "${RELAYS[@]}"; do
        echo "    server $r 127.0.0.1:${LISTEN[$r]}" >>haproxy.cfg
    done
}

# ---- start ---------------------------------------------------------------------------------
CANDIDATES=$(seq -f "env-%g" 0 47)
: >environments
for id in $CANDIDATES; do start_env "$id"; done
start_nats
for r in "${RELAYS[@]}"; do start_relay "$r"; done
write_haproxy
haproxy -c -f haproxy.cfg >/dev/null
haproxy -db -f haproxy.cfg >>haproxy.log 2>&1 &
PIDS[haproxy]=$!

# Where the front sends each candidate id with four relays, then with three (relay-4 down):
# the environment X moves to relay-4 when it joins; Y stays where it is.
routes() { for id in $CANDIDATES; do echo "$id $(relay_of "$id")"; done; }
all_four() { routes | awk '{print $2}' | sort -u | grep -c '^relay-' | grep -qx 4; }
until_ok 30 "HAProxy sees the four relays up" all_four
routes >routes-4
kill -TERM "${PIDS[relay-4]}"
wait "${PIDS[relay-4]}" 2>/dev/null || true
unset 'PIDS[relay-4]'
no_four() { ! routes | grep -q 'relay-4'; }
until_ok 30 "HAProxy sees relay-4 down" no_four
routes >routes-3
X=""
Y=""
while read -r id r4; do
    r3=$(awk -v i="$id" '$1 == i {print $2}' routes-3)
    if [ -z "$X" ] && [ "$r4" = relay-4 ]; then X=$id; XHOME=$r3; fi
done <routes-4
while read -r id r4; do
    r3=$(awk -v i="$id" '$1 == i {print $2}' routes-3)
    if [ -z "$Y" ] && [ "$r4" = "$r3" ] && [ "$r3" != "$XHOME" ]; then Y=$id; YHOME=$r3; fi
done <routes-4
[ -n "$X" ] && [ -n "$Y" ] || fail "no environment id hashes to relay-4 among $CANDIDATES"
echo "# X=$X on $XHOME (relay-4 once it joins); Y=$Y on $YHOME"
serve_env "$X"
serve_env "$Y"
online() { [ "$(run "$(via_front "$1")" "$1" echo up)" = up ]; }
until_ok 60 "$X online" online "$X"
until_ok 60 "$Y online" online "$Y"

sum_metric() {
    local name=$1 total=0
    for r in relay-1 relay-2 relay-3; do total=$((total + $(metric "$r" "$name"))); done
    echo "$total"
}

# ---- 1. affinity ---------------------------------------------------------------------------
lookups0=$(sum_metric execrelay_relay_cluster_lookups_total)
fwd0=$(sum_metric execrelay_relay_cluster_forwarded_streams_total)
for i in 1 2 3 4 5; do
    for id in "$X" "$Y"; do
        out=$(run "$(via_front "$id")" "$id" sh -c "seq 1 $((i * 100))")
        [ "$out" = "$(seq 1 $((i * 100)))" ] || fail "affinity: output of $id through the front"
    done
done
[ "$(sum_metric execrelay_relay_cluster_lookups_total)" = "$lookups0" ] ||
    fail "affinity: a relay asked the directory"
[ "$(sum_metric execrelay_relay_cluster_forwarded_streams_total)" = "$fwd0" ] ||
    fail "affinity: a stream was forwarded"
[ "$(metric "$YHOME" execrelay_relay_cluster_environments_held)" -ge 1 ] ||
    fail "affinity: $YHOME does not hold $Y"
ok "affinity: environment and client links of one id on one relay, no lookup, no forwarding"

# ---- 2. a forced misroute -----------------------------------------------------------------
OTHER=relay-1
[ "$OTHER" = "$YHOME" ] && OTHER=relay-2
MARK="plain-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
before=$(metric "$OTHER" execrelay_relay_cluster_forwarded_streams_total)
: >"hop-$YHOME.bin"
out=$(run "$(direct "$OTHER" "$Y")" "$Y" sh -c "yes $MARK | head -n 2000")
[ "$out" = "$(yes "$MARK" | head -n 2000)" ] || fail "misroute: output not exact"
after=$(metric "$OTHER" execrelay_relay_cluster_forwarded_streams_total)
[ "$after" -gt "$before" ] || fail "misroute: $OTHER forwarded no stream"
[ -s "hop-$YHOME.bin" ] || fail "misroute: nothing crossed the relay-to-relay hop"
if grep -qa "$MARK" "hop-$YHOME.bin"; then fail "misroute: plaintext on the relay-to-relay hop"; fi
if grep -qa "$MARK" "$OTHER.log" "$OTHER.out"; then fail "misroute: plaintext in $OTHER's log"; fi
ok "forced misroute: exact output through the relay-to-relay link, no plaintext on the hop ($(stat -c %s "hop-$YHOME.bin") bytes)"

# ---- 3. nats-server stopped ----------------------------------------------------------------
kill -TERM "${PIDS[nats]}"
wait "${PIDS[nats]}" 2>/dev/null || true
unset 'PIDS[nats]'
directory_down() { for r in relay-1 relay-2 relay-3; do [ "$(metric "$r" execrelay_relay_cluster_directory_up)" = 0 ] || return 1; done; }
until_ok 20 "relays see the directory down" directory_down
out=$(run "$(via_front "$Y")" "$Y" sh -c "seq 1 500")
[ "$out" = "$(seq 1 500)" ] || fail "NATS down: affine output not exact"
t0=$SECONDS
set +e
run "$(direct "$OTHER" "$Y")" "$Y" echo never >/dev/null 2>err-misroute
code=$?
set -e
[ "$code" -eq 255 ] || fail "NATS down: a misroute exited $code (expected 255)"
grep -q directory_unavailable err-misroute || fail "NATS down: no clear reason: $(cat err-misroute)"
[ $((SECONDS - t0)) -le 5 ] || fail "NATS down: the misroute took $((SECONDS - t0))s to fail"
start_nats
directory_up() { for r in relay-1 relay-2 relay-3; do [ "$(metric "$r" execrelay_relay_cluster_directory_up)" = 1 ] || return 1; done; }
until_ok 30 "relays see the directory again" directory_up
misroute_works() { [ "$(run "$(direct "$OTHER" "$Y")" "$Y" echo back)" = back ]; }
until_ok 30 "misroutes forwarded again" misroute_works
ok "nats-server stopped: affine works, misroute fails fast ($(grep -o 'directory_unavailable' err-misroute | head -1)), recovery once it is back"

# ---- 4. a relay added ----------------------------------------------------------------------
# A command on X through the front (on XHOME), running across the move.
run "$(via_front "$X")" "$X" sh -c 'for i in $(seq 1 300); do echo line-$i; sleep 0.02; done' \
    >move.out 2>move.err &
PIDS[move-client]=$!
moves0=$(metric "$XHOME" execrelay_relay_cluster_moves_total)
start_relay relay-4
front_sends_x_to_4() { [ "$(relay_of "$X")" = relay-4 ]; }
until_ok 30 "HAProxy sends $X to relay-4" front_sends_x_to_4
# A client of X through the front lands on relay-4, which forwards it and asks X home. A
# client that connects in the instant of the move itself (the environment between two
# relays) waits for it (FIRST_CONNECT_OFFLINE_WAIT) and runs once X is on relay-4.
client_of_x() { [ "$(run "$(via_front "$X")" "$X" sh -c "seq 1 50")" = "$(seq 1 50)" ]; }
until_ok 30 "relay added: a client of $X through the front" client_of_x
x_home() { [ "$(metric relay-4 execrelay_relay_cluster_environments_held)" = 1 ]; }
until_ok 30 "$X moved to relay-4" x_home
[ "$(metric "$XHOME" execrelay_relay_cluster_moves_total)" -gt "$moves0" ] ||
    fail "relay added: $XHOME counted no move"
wait "${PIDS[move-client]}" || fail "relay added: the command across the move failed: $(cat move.err)"
unset 'PIDS[move-client]'
[ "$(cat move.out)" = "$(seq -f 'line-%g' 1 300)" ] || fail "relay added: output lost or repeated across the move"
fwd4=$(metric relay-4 execrelay_relay_cluster_forwarded_streams_total)
out=$(run "$(via_front "$X")" "$X" sh -c "seq 1 50")
[ "$out" = "$(seq 1 50)" ] || fail "relay added: a client after the move"
[ "$(metric relay-4 execrelay_relay_cluster_forwarded_streams_total)" = "$fwd4" ] ||
    fail "relay added: still forwarding after the move"
ignored=$(( $(sum_metric execrelay_relay_cluster_front_header_ignored_total) + $(metric relay-4 execrelay_relay_cluster_front_header_ignored_total) ))
[ "$ignored" = 0 ] || fail "relay added: $ignored front headers ignored (HAProxy's source is in --trusted-front)"
ok "relay added: $X moved $XHOME -> relay-4 (moves counted), no output lost, then no forwarding"

# ---- 5. a relay killed ---------------------------------------------------------------------
run "$(via_front "$X")" "$X" sh -c 'for i in $(seq 1 300); do echo kill-$i; sleep 0.02; done' \
    >kill.out 2>kill.err &
PIDS[kill-client]=$!
started() { grep -q kill-20 kill.out; }
until_ok 30 "the command on $X started" started
kill -KILL "${PIDS[relay-4]}"
wait "${PIDS[relay-4]}" 2>/dev/null || true
unset 'PIDS[relay-4]'
wait "${PIDS[kill-client]}" || fail "relay killed: the command did not resume: $(cat kill.err)"
unset 'PIDS[kill-client]'
[ "$(cat kill.out)" = "$(seq -f 'kill-%g' 1 300)" ] || fail "relay killed: output lost or repeated"
back_home() { [ "$(metric "$XHOME" execrelay_relay_cluster_environments_held)" -ge 1 ] && [ "$(relay_of "$X")" = "$XHOME" ]; }
until_ok 30 "$X back on $XHOME" back_home
ok "relay killed: $X re-dialled to $XHOME through HAProxy, the client resumed with 0 bytes lost"

# ---- 6. 1,000 streams ----------------------------------------------------------------------
cat >one.sh <<EOF
#!/usr/bin/env bash
# One stream: job N, on X or Y, through the front or misrouted straight to a relay.
n=\$1
if [ \$((n % 2)) -eq 0 ]; then id=$X; else id=$Y; fi
case \$((n % 3)) in
    0) url=relay+ws://127.0.0.1:${LISTEN[relay-1]}/\$id ;;
    1) url=relay+ws://127.0.0.1:${LISTEN[relay-2]}/\$id ;;
    *) url=relay+ws://$FRONT/\$id ;;
esac
lines=\$((n % 97 + 1))
out=\$($EXECRELAY run "\$url" --server-key server-\$id.pub --key client -- seq 1 \$lines 2>>streams.err)
if [ "\$out" = "\$(seq 1 \$lines)" ]; then echo ok; else echo "fail \$n \$url"; fi
EOF
chmod +x one.sh
seq 1 1000 | xargs -P 24 -n 1 ./one.sh >streams.out
good=$(grep -c '^ok$' streams.out || true)
[ "$good" = 1000 ] || fail "1,000 streams: $good exact ($(grep -v '^ok$' streams.out | head -3 | tr '\n' ';'))"
ok "1,000 streams across the cluster (through HAProxy and misrouted), every output exact"

echo "$PASSED passed, $FAILED failed"
