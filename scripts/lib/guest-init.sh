#!/bin/sh
# /init of the rnic-emu test guest (busybox ash). scripts/guest-image packs it as /init.
#
# It brings the guest up (proc, sys, dev, hugepages, eth0 on QEMU's user network), prints
# evidence of the PCI functions it sees, runs the commands handed over on the kernel
# command line and powers the machine off, also when something failed.
#
# Kernel command line parameters (all optional; the kernel ignores "rnic.*" words):
#   rnic.run=BASE64     the commands to run: base64 of a text with one shell command per
#                       line (empty lines and lines starting with # are skipped). Without
#                       it the guest starts a shell on the console (for people debugging
#                       their own setup) and powers off when it exits.
#   rnic.timeout=SECS   how long one command may run (default 300)
#   rnic.hugepages=N    2 MiB pages to reserve (default 64): the rnic-verbs pci backend
#                       takes its DMA memory from them
#   rnic.ip=A.B.C.D/N   eth0's address (default 10.0.2.15/24, QEMU's -netdev user)
#   rnic.gw=A.B.C.D     the default gateway (default 10.0.2.2: the host under -netdev user)
#   rnic.pci=VVVV:DDDD  the NIC's vendor:device, for the evidence (default 1234:5244)
#
# Every line meant for the host starts with "RNIC-E2E: " (scripts/qemu-e2e parses them):
#   RNIC-E2E: BOOT kernel=… mem_kb=…
#   RNIC-E2E: PCI SLOT VVVV:DDDD class=CCCCCC        one per function, like lspci -n
#   RNIC-E2E: NIC SLOT VVVV:DDDD BARn=START+SIZE …     our function, with its BARs
#   RNIC-E2E: NIC none                                 our function is missing
#   RNIC-E2E: HUGEPAGES total=N
#   RNIC-E2E: NET eth0 ADDR | NET failed …
#   RNIC-E2E: STEP K BEGIN COMMAND / STEP K END rc=N
#   RNIC-E2E: DONE rc=N steps=K                       always the last one
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
umask 022

mark() { echo "RNIC-E2E: $*"; }

# Whatever happens from here on, the machine goes down: a test VM that hangs would only
# be caught by the host's timeout, much later and with less to go on.
finish() {
    mark "DONE rc=$1 steps=${steps:-0}"
    sync
    poweroff -f
    # poweroff -f does not return; if it ever did, init exiting panics the kernel, and
    # panic=-1 with QEMU's -no-reboot ends the VM as well.
    exit "$1"
}

mkdir -p /proc /sys /dev /tmp /run /dev/hugepages
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/hugepages
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

# The kernel command line, word by word (no quoting is used in rnic.* values).
run_b64=""
timeout_s=300
hugepages=64
ip_addr=10.0.2.15/24
gateway=10.0.2.2
nic_id=1234:5244
for word in $(cat /proc/cmdline); do
    case "$word" in
        rnic.run=*) run_b64="${word#rnic.run=}" ;;
        rnic.timeout=*) timeout_s="${word#rnic.timeout=}" ;;
        rnic.hugepages=*) hugepages="${word#rnic.hugepages=}" ;;
        rnic.ip=*) ip_addr="${word#rnic.ip=}" ;;
        rnic.gw=*) gateway="${word#rnic.gw=}" ;;
        rnic.pci=*) nic_id="${word#rnic.pci=}" ;;
    esac
done

mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
mark "BOOT kernel=$(uname -r) mem_kb=$mem_kb"

# Modules for the user-mode NIC (virtio_pci, virtio_net and what they need), in the load
# order scripts/guest-image computed from the modules' own "depends=" fields.
if [ -f /lib/modules/load-order ]; then
    while read -r module; do
        [ -n "$module" ] || continue
        insmod "/lib/modules/$module" 2>/dev/null || echo "init: insmod $module failed"
    done </lib/modules/load-order
fi

# lspci -n, from sysfs: busybox has no lspci.
nic_slot=""
for dev in /sys/bus/pci/devices/*; do
    [ -e "$dev/vendor" ] || continue
    slot="${dev##*/}"
    vendor=$(cat "$dev/vendor")
    device=$(cat "$dev/device")
    class=$(cat "$dev/class")
    id="${vendor#0x}:${device#0x}"
    mark "PCI $slot $id class=${class#0x}"
    if [ "$id" = "$nic_id" ] && [ -z "$nic_slot" ]; then
        nic_slot="$slot"
    fi
done
# A real lspci, if the image has one (busybox 1.35 as Debian builds it does not).
if command -v lspci >/dev/null 2>&1; then
    lspci -nn 2>/dev/null | while read -r entry; do mark "LSPCI $entry"; done
fi
if [ -n "$nic_slot" ]; then
    # The resource file has one "start end flags" line per BAR (then the ROM and the
    # bridge windows); an unused BAR reads as zeros.
    bars=""
    index=0
    while read -r start end _; do
        if [ "$index" -le 5 ] && [ "$((start))" -ne 0 ]; then
            size=$((end - start + 1))
            bars="$bars BAR$index=$start+$(printf '0x%x' "$size")"
        fi
        index=$((index + 1))
    done <"/sys/bus/pci/devices/$nic_slot/resource"
    mark "NIC $nic_slot $nic_id$bars"
else
    mark "NIC none"
fi

# Hugepages: the pci backend's DMA memory must stay put at known physical addresses.
echo "$hugepages" >/proc/sys/vm/nr_hugepages 2>/dev/null
mount -t hugetlbfs hugetlbfs /dev/hugepages 2>/dev/null
mark "HUGEPAGES total=$(cat /proc/sys/vm/nr_hugepages)"

# eth0 appears once virtio_net has probed the device; give it a few seconds.
ip link set lo up
waited=0
while [ ! -e /sys/class/net/eth0 ] && [ "$waited" -lt 50 ]; do
    sleep 0.2
    waited=$((waited + 1))
done
if [ -e /sys/class/net/eth0 ] && ip link set eth0 up && ip addr add "$ip_addr" dev eth0 &&
    ip route add default via "$gateway"; then
    mark "NET eth0 $ip_addr via $gateway"
else
    mark "NET failed: no eth0 or it could not be configured"
fi

if [ -z "$run_b64" ]; then
    echo "init: no rnic.run= on the kernel command line; starting a shell (exit powers off)"
    setsid cttyhack sh
    finish 0
fi

if ! echo "$run_b64" | base64 -d >/tmp/rnic-run 2>/dev/null; then
    mark "STEP 0 END rc=2 (rnic.run= is not valid base64)"
    finish 2
fi

# One command per line; stop at the first failure, since later steps (rnic-bench clients
# against a host that has given up) could only wait for their own timeouts.
steps=0
rc=0
while read -r line <&3; do
    case "$line" in '' | '#'*) continue ;; esac
    steps=$((steps + 1))
    mark "STEP $steps BEGIN $line"
    timeout "$timeout_s" sh -c "$line" </dev/null
    step_rc=$?
    mark "STEP $steps END rc=$step_rc"
    if [ "$step_rc" -ne 0 ]; then
        rc=$step_rc
        break
    fi
done 3</tmp/rnic-run
finish "$rc"
