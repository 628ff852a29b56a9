#!/usr/bin/env bash
# ssh_baseline.sh - measure OpenSSH baselines on this machine for execrelay.
#
# Starts a throwaway sshd on 127.0.0.1 (never on another interface), measures
# bulk throughput and per-command latency, and prints machine-readable
# "KEY VALUE" lines on stdout. Everything human-readable goes to stderr, so
# the benchmark runner can simply parse stdout.
#
# Environment (all optional):
#   SSH_BENCH_PORT     port for the throwaway sshd            (default 2222)
#   BENCH_BYTES        bytes per throughput run               (default 1073741824 = 1 GiB)
#   BENCH_REPEATS      throughput runs; the median is reported (default 5)
#   SSH_LATENCY_RUNS   timed runs through a ControlMaster     (default 1000)
#   SSH_FRESH_RUNS     timed runs with a fresh connection     (default 30)
#   SSH_BENCH_KEEP_RC  1 = let the remote bash source root's ~/.bashrc
#                      (default 0, see the SetEnv comment in the sshd_config)
#
# stdout keys (values are plain decimal numbers):
#   raw_pipe_MBps ssh_chacha_MBps ssh_cpu_s_per_GB ssh_cpu_client_s_per_GB
#   ssh_cpu_server_s_per_GB ssh_aes128gcm_MBps ssh_upload_MBps ssh_upload_cpu_s_per_GB
#   ssh_controlmaster_p50_ms ssh_controlmaster_p99_ms
#   ssh_fresh_p50_ms ssh_fresh_p99_ms
# 1 MB = 1e6 bytes, 1 GB = 1e9 bytes. Percentiles use the nearest-rank method.
set -euo pipefail

PORT="${SSH_BENCH_PORT:-2222}"
BYTES="${BENCH_BYTES:-1073741824}"
REPEATS="${BENCH_REPEATS:-5}"
CM_RUNS="${SSH_LATENCY_RUNS:-1000}"
FRESH_RUNS="${SSH_FRESH_RUNS:-30}"
KEEP_RC="${SSH_BENCH_KEEP_RC:-0}"
SSHD=/usr/sbin/sshd   # sshd insists on an absolute path (it re-executes itself)

log() { printf '[ssh_baseline] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for v in PORT BYTES REPEATS CM_RUNS FRESH_RUNS; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done
[ "$(id -u)" -eq 0 ] || die "must run as root (sshd needs root, and we log in as root)"

# ---------------------------------------------------------------- install ---
# Only touch apt when something is actually missing; `apt-get update` is slow
# and needs the registry, so it is the fallback, not the first step.
apt_install() {
    # On a machine without policy-rc.d, installing openssh-server would start
    # a system-wide sshd on 0.0.0.0:22. Block service starts for the duration
    # of the install (and only if no policy is present already).
    local created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q "$@" >&2; then
        log "apt-get install failed; running apt-get update and retrying"
        { apt-get update -q >&2 && apt-get install -y -q "$@" >&2; } || rc=$?
    fi
    [ "$created_policy" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    return "$rc"
}

missing=()
[ -x "$SSHD" ] || missing+=(openssh-server)
command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing: ${missing[*]}"
    apt_install "${missing[@]}" || die "could not install ${missing[*]}"
fi
[ -x "$SSHD" ] || die "$SSHD still missing after install"
SSH="$(command -v ssh)"

# ---------------------------------------------------------------- cleanup ---
TMP="$(mktemp -d /tmp/ssh_baseline.XXXXXX)"
SSHD_PID=""
PY_PID=""
CREATED_PRIVSEP=0
cleanup() {
    local rc=$?
    set +e
    [ -n "$PY_PID" ] && kill "$PY_PID" 2>/dev/null
    # Stop the ControlMaster first: it holds a session that lives in its own
    # sshd child, which killing the listener alone would leave behind.
    if [ -S "$TMP/cm" ]; then
        "$SSH" -F "$TMP/ssh_config" -o ControlPath="$TMP/cm" -O exit 127.0.0.1 >/dev/null 2>&1
    fi
    if [ -n "$SSHD_PID" ] && kill -0 "$SSHD_PID" 2>/dev/null; then
        # Any connection children still around are ours too; end them by pid.
        local kids
        kids="$(cat "/proc/$SSHD_PID/task/$SSHD_PID/children" 2>/dev/null)"
        kill "$SSHD_PID" $kids 2>/dev/null
        wait "$SSHD_PID" 2>/dev/null
    fi
    [ "$CREATED_PRIVSEP" -eq 1 ] && rmdir /run/sshd 2>/dev/null
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --------------------------------------------------------- keys & configs ---
ssh-keygen -q -t ed25519 -N '' -C ssh_baseline_host   -f "$TMP/host_key"
ssh-keygen -q -t ed25519 -N '' -C ssh_baseline_client -f "$TMP/client_key"
cp "$TMP/client_key.pub" "$TMP/authorized_keys"

# Debian's bash is built with SSH_SOURCE_BASHRC: `ssh host cmd` runs
# `bash -c cmd`, which sources ~/.bashrc (here: pyenv init, ~95 ms) when
# SHLVL<2. That is dotfile cost, not ssh cost, so by default we pretend to be
# a nested shell; the remote command still runs through the login shell as
# ssh always does.
SETENV_LINE="SetEnv SHLVL=1"
[ "$KEEP_RC" = 1 ] && SETENV_LINE="# SetEnv disabled (SSH_BENCH_KEEP_RC=1)"

cat >"$TMP/sshd_config" <<EOF
# Throwaway sshd for benchmarks: loopback only, key auth only, root only.
ListenAddress 127.0.0.1
Port $PORT
AddressFamily inet
HostKey $TMP/host_key
PidFile $TMP/sshd.pid
AuthorizedKeysFile $TMP/authorized_keys
AllowUsers root
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
LogLevel INFO
# Sequential fresh connections must never be throttled.
MaxStartups 100:30:200
MaxSessions 100
$SETENV_LINE
EOF

# -F makes the client ignore ~/.ssh/config and /etc/ssh/ssh_config, so the
# numbers do not depend on whatever the host has configured.
cat >"$TMP/ssh_config" <<EOF
Host *
    User root
    Port $PORT
    IdentityFile $TMP/client_key
    IdentitiesOnly yes
    IdentityAgent none
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    BatchMode yes
    LogLevel ERROR
    Compression no
    RequestTTY no
    GSSAPIAuthentication no
    ControlMaster no
    ControlPath none
    ConnectTimeout 5
EOF

# --------------------------------------------------------------- start sshd ---
# Refuse to measure some other server that already owns the port.
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "127.0.0.1:$PORT is already in use; set SSH_BENCH_PORT to a free port"
fi
# Privilege-separation directory; missing in containers that never ran sshd.
if [ ! -d /run/sshd ]; then
    mkdir -p -m 0755 /run/sshd
    CREATED_PRIVSEP=1
fi
"$SSHD" -t -f "$TMP/sshd_config" 2>"$TMP/sshd_test.log" \
    || die "sshd rejected its config: $(cat "$TMP/sshd_test.log")"

# Own stdio so the runner's pipes are never held open by sshd.
"$SSHD" -D -e -f "$TMP/sshd_config" </dev/null >/dev/null 2>"$TMP/sshd.log" &
SSHD_PID=$!

# Bounded wait (10 s): a real login, not just a TCP connect, proves the
# key, config and shell all work.
ready=0
for _ in $(seq 1 100); do
    kill -0 "$SSHD_PID" 2>/dev/null || die "sshd exited during startup: $(cat "$TMP/sshd.log")"
    if "$SSH" -F "$TMP/ssh_config" -o ConnectTimeout=1 127.0.0.1 true </dev/null 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.1
done
[ "$ready" -eq 1 ] || die "sshd on 127.0.0.1:$PORT did not accept a login within 10 s: $(cat "$TMP/sshd.log")"
log "sshd pid $SSHD_PID ready on 127.0.0.1:$PORT ($("$SSH" -V 2>&1))"

# SSH_BASELINE_EXEC: run that command (bash -c) while this sshd is up, with
# SSH_BENCH_CONFIG (the client config to pass with -F) in its environment, and
# exit with its status instead of measuring here (benches/python_sdk.sh).
if [ -n "${SSH_BASELINE_EXEC:-}" ]; then
    SSH_BENCH_CONFIG="$TMP/ssh_config" SSH_BENCH_DIR="$TMP" bash -c "$SSH_BASELINE_EXEC"
    exit $?
fi

# ------------------------------------------------------------- measure ---
# Python times each run with perf_counter (monotonic, ns resolution), which
# avoids the fork cost of calling `date` around every sample.
cat >"$TMP/bench.py" <<'PY'
import os, shlex, statistics, subprocess, sys, time

ssh, cfg, tmp = os.environ["SSH"], os.environ["CFG"], os.environ["TMP"]
nbytes, repeats = int(os.environ["BYTES"]), int(os.environ["REPEATS"])
cm_runs, fresh_runs = int(os.environ["CM_RUNS"]), int(os.environ["FRESH_RUNS"])
sshd_pid = int(os.environ["SSHD_PID"])
host = "127.0.0.1"
base = [ssh, "-F", cfg]
DEVNULL = subprocess.DEVNULL
CLK = os.sysconf("SC_CLK_TCK")

def out(key, val):
    print(f"{key} {val:.3f}", flush=True)

def human(msg):
    print(f"[ssh_baseline] {msg}", file=sys.stderr, flush=True)

def run_checked(argv, what):
    r = subprocess.run(argv, stdin=DEVNULL, stdout=DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        sys.exit(f"{what} failed (rc={r.returncode}): {r.stderr.decode(errors='replace').strip()}")

def timed(argv, what):
    """Wall time of one command plus its own rusage (os.wait4 on its pid)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=DEVNULL, stdout=DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace").strip()
    p.stderr.close()
    if p.returncode != 0:
        sys.exit(f"{what} failed (rc={p.returncode}): {err}")
    return dt, ru.ru_utime + ru.ru_stime

def sshd_reaped_cpu():
    """CPU of sshd's exited descendants (connection handlers, remote shell,
    remote head): the listener reaps them, so it lands in its cutime/cstime."""
    with open(f"/proc/{sshd_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLK  # cutime, cstime

def sshd_children():
    try:
        with open(f"/proc/{sshd_pid}/task/{sshd_pid}/children") as f:
            return f.read().split()
    except OSError:
        return None

def wait_sshd_idle():
    # The client can exit a moment before the server side is reaped.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = sshd_children()
        if kids is None:
            time.sleep(0.5)
            return
        if not kids:
            return
        time.sleep(0.01)

def pct(samples, p):
    s = sorted(samples)
    k = max(1, -(-len(s) * p // 100))  # nearest rank: ceil(p/100 * n)
    return s[int(k) - 1]

def latency(argv, runs, warmup, what):
    for _ in range(warmup):  # first runs pay page-cache / socket setup costs
        timed(argv, what)
    return [timed(argv, what)[0] * 1e3 for _ in range(runs)]

# 1. raw pipe: the ceiling any byte-moving tool on this box is measured against
raw = [nbytes / 1e6 / timed(["bash", "-c", f"head -c {nbytes} /dev/zero | cat >/dev/null"],
                            "raw pipe")[0] for _ in range(repeats)]
human(f"raw pipe: {', '.join(f'{x:.0f}' for x in raw)} MB/s")
out("raw_pipe_MBps", statistics.median(raw))

# 2. ssh bulk transfer with chacha20-poly1305 (includes connection setup,
#    ~0.1 s, as a user of `ssh host cmd > file` would see it)
wait_sshd_idle()
rates, cpus = [], []
for _ in range(repeats):
    before = sshd_reaped_cpu()
    dt, client_cpu = timed(base + ["-c", "chacha20-poly1305@openssh.com", host,
                                   f"head -c {nbytes} /dev/zero"], "ssh chacha transfer")
    wait_sshd_idle()
    rates.append(nbytes / 1e6 / dt)
    cpus.append((client_cpu, sshd_reaped_cpu() - before))
human(f"ssh chacha20-poly1305: {', '.join(f'{x:.0f}' for x in rates)} MB/s")
out("ssh_chacha_MBps", statistics.median(rates))
gb = nbytes / 1e9
c_cpu = statistics.median(c for c, _ in cpus) / gb
s_cpu = statistics.median(s for _, s in cpus) / gb
human(f"ssh CPU per GB: client {c_cpu:.2f} s, server (sshd + remote shell/head) {s_cpu:.2f} s")
out("ssh_cpu_s_per_GB", c_cpu + s_cpu)
out("ssh_cpu_client_s_per_GB", c_cpu)
out("ssh_cpu_server_s_per_GB", s_cpu)

# 2a. the same with aes128-gcm@openssh.com (AES-NI; what the AESGCM Noise suite is compared to)
wait_sshd_idle()
rates = []
for _ in range(repeats):
    dt, _ = timed(base + ["-c", "aes128-gcm@openssh.com", host,
                          f"head -c {nbytes} /dev/zero"], "ssh aes128-gcm transfer")
    wait_sshd_idle()
    rates.append(nbytes / 1e6 / dt)
human(f"ssh aes128-gcm: {', '.join(f'{x:.0f}' for x in rates)} MB/s")
out("ssh_aes128gcm_MBps", statistics.median(rates))

# 2b. ssh upload with chacha20-poly1305: `head -c N /dev/zero | ssh host 'cat >/dev/null'`
#     (the client side's CPU includes `head`, as `execrelay run`'s upload figure does not)
rates, cpus = [], []
for _ in range(repeats):
    before = sshd_reaped_cpu()
    line = (f"head -c {nbytes} /dev/zero | "
            + " ".join(shlex.quote(a) for a in base + ["-c", "chacha20-poly1305@openssh.com",
                                                        host, "cat >/dev/null"]))
    dt, client_cpu = timed(["bash", "-c", line], "ssh upload")
    wait_sshd_idle()
    rates.append(nbytes / 1e6 / dt)
    cpus.append(client_cpu + sshd_reaped_cpu() - before)
human(f"ssh upload chacha20-poly1305: {', '.join(f'{x:.0f}' for x in rates)} MB/s")
out("ssh_upload_MBps", statistics.median(rates))
out("ssh_upload_cpu_s_per_GB", statistics.median(cpus) / gb)

# 3. fresh connection per command (full key exchange + auth each time)
fresh = latency(base + [host, "true"], fresh_runs, 2, "fresh ssh")
human(f"fresh ssh true: n={len(fresh)} p50={pct(fresh, 50):.2f} ms "
      f"p99={pct(fresh, 99):.2f} ms min={min(fresh):.2f} ms")
out("ssh_fresh_p50_ms", pct(fresh, 50))
out("ssh_fresh_p99_ms", pct(fresh, 99))

# 4. multiplexed over a ControlMaster (new channel + remote exec only)
cp = os.path.join(tmp, "cm")
run_checked(base + ["-o", "ControlMaster=yes", "-o", f"ControlPath={cp}",
                    "-o", "ControlPersist=yes", "-N", "-f", host], "ControlMaster start")
cm = latency(base + ["-o", f"ControlPath={cp}", host, "true"], cm_runs, 10, "ControlMaster ssh")
human(f"ControlMaster ssh true: n={len(cm)} p50={pct(cm, 50):.2f} ms "
      f"p99={pct(cm, 99):.2f} ms min={min(cm):.2f} ms")
out("ssh_controlmaster_p50_ms", pct(cm, 50))
out("ssh_controlmaster_p99_ms", pct(cm, 99))
PY

log "measuring: BENCH_BYTES=$BYTES x$REPEATS, SSH_FRESH_RUNS=$FRESH_RUNS, SSH_LATENCY_RUNS=$CM_RUNS"
# Run in the background and `wait`: bash defers traps while a foreground child
# runs, so a TERM from the runner would otherwise wait for the whole benchmark.
SSH="$SSH" CFG="$TMP/ssh_config" TMP="$TMP" BYTES="$BYTES" REPEATS="$REPEATS" \
CM_RUNS="$CM_RUNS" FRESH_RUNS="$FRESH_RUNS" SSHD_PID="$SSHD_PID" \
    python3 "$TMP/bench.py" &
PY_PID=$!
wait "$PY_PID" || die "measurement failed; sshd log tail: $(tail -n 20 "$TMP/sshd.log")"
PY_PID=""
log "done"
