# shellcheck shell=bash
# Sourced helpers for the link between the host and the rdma_rxe peer guest (issue 7).
#
# The link is a tap device in a network namespace of its own, created and removed here:
#
#   namespace $RXE_NS
#   ┌──────────────────────────────────────────────┐
#   │ tap $RXE_TAP  $RXE_HOST_IP (agent, TCP OOB)  │──── QEMU virtio-net ──── guest eth0 $RXE_GUEST_IP
#   │   + rnic-emu --net eth:$RXE_TAP: $RXE_NIC_IP │                          rxe0 on eth0
#   └──────────────────────────────────────────────┘
#
# Usage:
#   . scripts/lib/rxe-link.sh
#   rxe_link_setup                  # namespace, tap, addresses; sets the cleanup trap
#   rxe_guest_boot KERNEL INITRD QEMU
#   rxe_guest_wait_ready            # rxe0 ACTIVE, agent running
#   rxe_guest_run 'ibv_devinfo'     # a command in the guest; its output and exit code
#   rxe_guest_spawn srv 'ib_write_bw -d rxe0'; rxe_guest_wait srv
#   rxe_ns <cmd>                    # a host command inside the namespace
#   rxe_guest_poweroff; rxe_link_cleanup (the trap also does it)
# rxe_link_setup sets the EXIT/INT/TERM traps; a caller with its own exit work sets its
# trap afterwards and calls rxe_link_cleanup from it.
#
# Settings (environment, before rxe_link_setup):
#   RXE_NS        namespace name          default rnic-rxe-<pid>-<random> (unique per run)
#   RXE_TAP       tap device              default rxtap0 (only visible in the namespace)
#   RXE_HOST_IP   host end of the link    default 10.77.0.1
#   RXE_GUEST_IP  guest eth0 / rxe0       default 10.77.0.2
#   RXE_NIC_IP    our NIC (rnic-emu)      default 10.77.0.3
#   RXE_PREFIX    prefix length           default 24
#   RXE_MTU       tap and guest MTU       default 9000: rxe's path MTU is the netdev MTU
#                 minus 80, so 9000 gives active_mtu 4096 (1500 would give only 1024)
#   RXE_PORT      agent TCP port          default 7700
#   RXE_GUEST_MAC guest eth0 MAC          default 52:54:00:77:00:02 (for --peer-mac)
#   RXE_RUN_DIR   console log, captures   default a new mktemp directory
#   RXE_TIMEOUT   guest watchdog seconds  default 1800
#   RXE_NETEM     netem options of a lossy link (rxe_netem_on without options), default
#                 "loss 2% delay 2ms reorder 25% 50%"; more loss makes rare races show
#   RXE_NETEM_EGRESS  netem options for the guest's own RoCE frames only (rxe_netem_on)

RXE_LINK_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

_rxe_log() { echo "rxe-link: $*" >&2; }

# Runs a host command inside the link's namespace.
rxe_ns() { ip netns exec "$RXE_NS" "$@"; }

# Creates the namespace and the tap with the host's address, and installs the cleanup
# trap (EXIT INT TERM). Exports the RXE_* settings for child scripts.
rxe_link_setup() {
    : "${RXE_NS:=rnic-rxe-$$-$RANDOM}"
    : "${RXE_TAP:=rxtap0}" "${RXE_HOST_IP:=10.77.0.1}" "${RXE_GUEST_IP:=10.77.0.2}"
    : "${RXE_NIC_IP:=10.77.0.3}" "${RXE_PREFIX:=24}" "${RXE_MTU:=9000}" "${RXE_PORT:=7700}"
    : "${RXE_TIMEOUT:=1800}" "${RXE_GUEST_MAC:=52:54:00:77:00:02}"
    . "$RXE_LINK_LIB_DIR/apt-mirror.sh"
    # ping for the link checks, tcpdump for the captures and tshark (capinfos, editcap) for
    # their checks, python3 for the agent.
    apt_install iproute2 iputils-ping tcpdump tshark python3 || return 1
    [ -n "${RXE_RUN_DIR:-}" ] || RXE_RUN_DIR=$(mktemp -d /tmp/rnic-rxe.XXXXXX)
    mkdir -p "$RXE_RUN_DIR"
    export RXE_NS RXE_TAP RXE_HOST_IP RXE_GUEST_IP RXE_NIC_IP RXE_PREFIX RXE_MTU RXE_PORT \
        RXE_TIMEOUT RXE_RUN_DIR RXE_GUEST_MAC
    RXE_QEMU_PID="" RXE_CAPTURE_PID=""
    trap 'rxe_link_cleanup' EXIT
    trap 'rxe_link_cleanup; exit 130' INT
    trap 'rxe_link_cleanup; exit 143' TERM
    ip netns add "$RXE_NS" || return 1
    rxe_ns ip link set lo up &&
        rxe_ns ip tuntap add dev "$RXE_TAP" mode tap &&
        rxe_ns ip link set "$RXE_TAP" mtu "$RXE_MTU" &&
        rxe_ns ip addr add "$RXE_HOST_IP/$RXE_PREFIX" dev "$RXE_TAP" &&
        rxe_ns ip link set "$RXE_TAP" up || {
        _rxe_log "cannot set up $RXE_TAP in $RXE_NS"
        return 1
    }
    _rxe_log "namespace $RXE_NS, $RXE_TAP $RXE_HOST_IP/$RXE_PREFIX mtu $RXE_MTU, run dir $RXE_RUN_DIR"
}

# Kills what the link started (capture, QEMU, anything else still running in the
# namespace, all by pid) and deletes the namespace. Idempotent; safe from a trap.
rxe_link_cleanup() {
    local pid pids
    [ -n "${RXE_NS:-}" ] || return 0
    if [ -n "${RXE_CAPTURE_PID:-}" ]; then
        rxe_capture_stop
    fi
    if [ -n "${RXE_QEMU_PID:-}" ] && kill -0 "$RXE_QEMU_PID" 2>/dev/null; then
        kill "$RXE_QEMU_PID" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$RXE_QEMU_PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$RXE_QEMU_PID" 2>/dev/null
    fi
    RXE_QEMU_PID=""
    if ip netns pids "$RXE_NS" >/dev/null 2>&1; then
        # Whatever else was started inside (an rnic-emu, an agent listener): our own,
        # since the namespace is private to this run.
        pids=$(ip netns pids "$RXE_NS" 2>/dev/null)
        for pid in $pids; do kill "$pid" 2>/dev/null; done
        sleep 0.2
        pids=$(ip netns pids "$RXE_NS" 2>/dev/null)
        for pid in $pids; do kill -KILL "$pid" 2>/dev/null; done
        ip netns del "$RXE_NS" 2>/dev/null
    fi
    RXE_NS=""
}

# rxe_guest_boot KERNEL INITRD QEMU: starts the guest in the background, its console
# (ttyS0) logged to $RXE_RUN_DIR/console.log. Extra kernel arguments: RXE_APPEND.
# RXE_PCI_SOCKET: an rnic-emu serve socket to attach as the guest's vfio-user PCI function
# (the guest's memory then lives in a shared memfd, which vfio-user needs).
rxe_guest_boot() {
    local kernel=$1 initrd=$2 qemu=$3 machine=q35,accel=tcg pci=()
    if [ -n "${RXE_PCI_SOCKET:-}" ]; then
        machine+=,memory-backend=mem
        pci=(-object memory-backend-memfd,id=mem,size=2048M,share=on
            -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"type\":\"unix\",\"path\":\"$RXE_PCI_SOCKET\"}}")
    fi
    local append="console=ttyS0 panic=1 loglevel=4 rnic.ip=$RXE_GUEST_IP/$RXE_PREFIX"
    append+=" rnic.host=$RXE_HOST_IP rnic.port=$RXE_PORT rnic.mtu=$RXE_MTU rnic.timeout=$RXE_TIMEOUT"
    append+=" ${RXE_APPEND:-}"
    : >"$RXE_RUN_DIR/console.log"
    # -no-reboot: a guest that panics or reboots ends QEMU instead of booting again.
    ip netns exec "$RXE_NS" "$qemu" -machine "$machine" -cpu max -m 2048 -smp 1 "${pci[@]}" \
        -L /usr/share/seabios -L /usr/share/qemu \
        -nodefaults -display none -no-reboot \
        -serial "file:$RXE_RUN_DIR/console.log" \
        -kernel "$kernel" -initrd "$initrd" -append "$append" \
        -netdev "tap,id=n0,ifname=$RXE_TAP,script=no,downscript=no" \
        -device "virtio-net-pci,netdev=n0,romfile=,mac=$RXE_GUEST_MAC" \
        </dev/null >"$RXE_RUN_DIR/qemu.log" 2>&1 &
    RXE_QEMU_PID=$!
    _rxe_log "guest booting (qemu pid $RXE_QEMU_PID)"
}

# rxe_guest_wait_ready [SECONDS]: waits for the init's READY line (rxe0 ACTIVE, agent
# up). Fails at once on the init's FAILED line or when QEMU has exited.
rxe_guest_wait_ready() {
    local limit=${1:-300} start=$SECONDS log="$RXE_RUN_DIR/console.log"
    while :; do
        if grep -q '^rnic-init: READY' "$log" 2>/dev/null; then
            _rxe_log "guest ready after $((SECONDS - start))s"
            return 0
        fi
        if grep -q '^rnic-init: FAILED' "$log" 2>/dev/null; then
            _rxe_log "guest failed: $(grep '^rnic-init: FAILED' "$log" | head -1)"
            return 1
        fi
        if ! kill -0 "$RXE_QEMU_PID" 2>/dev/null; then
            _rxe_log "QEMU exited before the guest was ready; console: $log"
            tail -5 "$RXE_RUN_DIR/qemu.log" >&2
            return 1
        fi
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            _rxe_log "guest not ready after ${limit}s; console: $log"
            return 1
        fi
        sleep 0.5
    done
}

# rxe_guest_run [-t SECONDS] COMMAND: runs a bash command line in the guest (as root, in
# /root) through the agent; prints its output (stdout and stderr merged) and returns its
# exit code (124: timed out, 125: connection lost).
rxe_guest_run() {
    local timeout=600
    if [ "${1:-}" = -t ]; then
        timeout=$2
        shift 2
    fi
    if [ -n "${RXE_QEMU_PID:-}" ] && ! kill -0 "$RXE_QEMU_PID" 2>/dev/null; then
        _rxe_log "the guest is not running (console: $RXE_RUN_DIR/console.log)"
        return 125
    fi
    rxe_ns python3 "$RXE_LINK_LIB_DIR/rxe-agent.py" --listen "$RXE_HOST_IP" --port "$RXE_PORT" \
        --timeout "$timeout" ${RXE_QEMU_PID:+--watch-pid "$RXE_QEMU_PID"} "$*"
}

# rxe_guest_spawn NAME COMMAND: starts COMMAND in the guest in the background (e.g. a
# perftest server) and returns at once. Collect it with rxe_guest_wait NAME.
rxe_guest_spawn() {
    rxe_guest_run "rnic-spawn $(printf '%q' "$1") $(printf '%q' "$2")"
}

# rxe_guest_wait NAME [SECONDS]: the output and exit code of a spawned command (124 and
# the command killed after SECONDS, default 120).
rxe_guest_wait() {
    local limit=${2:-120}
    rxe_guest_run -t $((limit + 30)) "rnic-wait $(printf '%q' "$1") $limit"
}

# rxe_guest_wait_port PORT [SECONDS]: until a spawned server listens on TCP PORT.
rxe_guest_wait_port() {
    rxe_guest_run "rnic-wait-port $1 ${2:-60}"
}

# rxe_guest_poweroff [SECONDS]: asks the guest to power off and waits for QEMU to exit
# (default 30 s), killing it after that. Returns 1 if it had to be killed.
rxe_guest_poweroff() {
    local limit=${1:-30} start=$SECONDS
    [ -n "${RXE_QEMU_PID:-}" ] || return 0
    rxe_guest_run -t 10 __rnic_poweroff__ >/dev/null 2>&1 || true
    while kill -0 "$RXE_QEMU_PID" 2>/dev/null; do
        if [ $((SECONDS - start)) -ge "$limit" ]; then
            _rxe_log "guest did not power off within ${limit}s, killing QEMU"
            kill -KILL "$RXE_QEMU_PID" 2>/dev/null
            wait "$RXE_QEMU_PID" 2>/dev/null
            RXE_QEMU_PID=""
            return 1
        fi
        sleep 0.2
    done
    wait "$RXE_QEMU_PID" 2>/dev/null
    RXE_QEMU_PID=""
}

# rxe_netem_on [NETEM OPTIONS]: makes the link lossy for RoCEv2 (UDP port 4791) in both
# directions, default $RXE_NETEM or "loss 2% delay 2ms reorder 25% 50%" (reordering in
# netem needs a delay: the chosen packets skip it). Done in the guest, for two reasons: the
# host kernel here has no sch_netem, and rnic-emu reads the tap with a packet socket, which
# sees frames before any tc ingress on the tap, so a host ifb could not drop guest-to-NIC
# frames.
# Guest egress: prio qdisc, RoCE to a band with netem. Guest ingress: RoCE redirected to
# ifb0, netem there. The agent's and perftest's TCP stay lossless. RXE_NETEM_EGRESS, when
# set, replaces the options on the guest's egress only (the frames rxe sends).
rxe_netem_on() {
    local opts=${*:-${RXE_NETEM:-loss 2% delay 2ms reorder 25% 50%}}
    local egress=${RXE_NETEM_EGRESS:-$opts} what
    what=$opts
    [ "$egress" = "$opts" ] || what="$opts, frames from the guest $egress"
    rxe_guest_run "set -e
modprobe ifb numifbs=1
modprobe -a sch_netem sch_prio sch_ingress cls_u32 act_mirred
ip link set ifb0 up
tc qdisc add dev eth0 root handle 1: prio
tc qdisc add dev eth0 parent 1:3 handle 30: netem limit 100000 $egress
tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 4791 0xffff flowid 1:3
tc qdisc add dev eth0 handle ffff: ingress
tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 4791 0xffff action mirred egress redirect dev ifb0
tc qdisc add dev ifb0 root netem limit 100000 $opts
echo 'netem on: $what'"
}

# rxe_netem_off: the link lossless again.
rxe_netem_off() {
    rxe_guest_run "tc qdisc del dev eth0 root 2>/dev/null; tc qdisc del dev eth0 ingress 2>/dev/null
tc qdisc del dev ifb0 root 2>/dev/null; echo netem off"
}

# rxe_netem_stats: the guest's qdisc counters (sent/dropped) for the lossy run's report.
rxe_netem_stats() {
    rxe_guest_run "tc -s qdisc show dev eth0; tc -s qdisc show dev ifb0"
}

# rxe_capture_start FILE [FILTER]: captures the tap (both directions) into a pcap.
rxe_capture_start() {
    local file=$1
    shift
    # ip netns exec directly, not the rxe_ns function: a backgrounded function is a
    # subshell, and $! would name that subshell instead of tcpdump.
    ip netns exec "$RXE_NS" tcpdump -Z root -i "$RXE_TAP" -s 0 -B 65536 -U -w "$file" "$@" >"$file.log" 2>&1 &
    RXE_CAPTURE_PID=$!
    # tcpdump says "listening on" once the socket is open: frames from then on are kept.
    for _ in $(seq 50); do
        grep -q 'listening on' "$file.log" 2>/dev/null && return 0
        sleep 0.1
    done
    _rxe_log "tcpdump did not start: $(cat "$file.log")"
    return 1
}

# rxe_capture_stop: ends the capture (tcpdump flushes it on SIGTERM; SIGINT would not
# do: a background job of a non-interactive shell ignores it).
rxe_capture_stop() {
    [ -n "${RXE_CAPTURE_PID:-}" ] || return 0
    # Frames still in the capture buffer when tcpdump stops are counted as "received by
    # filter" but never written: give it a moment to drain what the last exchange left.
    sleep 1
    kill -TERM "$RXE_CAPTURE_PID" 2>/dev/null
    wait "$RXE_CAPTURE_PID" 2>/dev/null
    RXE_CAPTURE_PID=""
}
