#!/bin/bash
# PID 1 of a lab guest, after the initramfs switch_root'ed into the overlay of
# the host's root. lab.sh copies this file onto the guest's "lab" share
# (/.lab) together with env.sh (lab settings), cmd.env and cmd.argv
# (NUL-separated environment and argv of the user's command).
# No `set -e`: whatever fails, we must still write /.lab/rc and power off,
# otherwise the host only learns about it at the timeout.
set -uo pipefail

LAB=/.lab
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "lab-guest[$(cut -d' ' -f1 /proc/uptime 2>/dev/null)]: $*"; }

power_off() {
    sync
    # busybox-static is on the host root, hence here too.
    /bin/busybox poweroff -f 2>/dev/null
    echo o >/proc/sysrq-trigger 2>/dev/null
    sleep 5
    exit 1 # PID 1 exiting panics; panic=-1 + QEMU -no-reboot ends QEMU.
}

finish() {
    echo "$1" >"$LAB/rc.tmp" && mv -f "$LAB/rc.tmp" "$LAB/rc"
    power_off
}

# A one-line reason on the command's stderr (what the host shows) and rc 125.
fail() {
    log "setup failed: $*"
    echo "lab: guest setup failed: $* (see the console log)" >>"$LAB/stderr"
    finish 125
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# The host's /run (pid files, sockets) means nothing here. /tmp stays the
# overlay: host files readable, guest writes kept in RAM.
mount -t tmpfs tmpfs /run

# shellcheck source=/dev/null
source "$LAB/env.sh" || fail "cannot read $LAB/env.sh"
hostname "lab-node${LAB_RANK:-0}" 2>/dev/null
# No DNS here: torchrun and gloo resolve this hostname, so it names the node's lab address.
echo "${LAB_NODE_IP:-127.0.1.1} lab-node${LAB_RANK:-0}" >>/etc/hosts

# The host has no /lib/modules for the guest kernel: bind the unpacked one.
mkdir -p "/lib/modules/$LAB_KV" || fail "cannot create /lib/modules/$LAB_KV"
mount --bind "$LAB_KMOD_DIR" "/lib/modules/$LAB_KV" || fail "cannot bind $LAB_KMOD_DIR"

# Files the command writes under its cwd must reach the host: rw 9p share.
# cache=mmap: reads and writes go straight to the host (both guests of run2
# see each other's files) and, unlike cache=none, shared writable mmap works
# (numpy.memmap, sqlite). cache=loose was not clearly faster for imports.
mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,cache=${LAB_CWD_CACHE:-mmap}" cwd "$LAB_CWD" \
    || fail "cannot mount the cwd share on $LAB_CWD"

log "mounts done"
ip link set lo up
modprobe -a ib_uverbs rdma_ucm rdma_rxe || fail "modprobe ib_uverbs rdma_ucm rdma_rxe failed"

# Brings a netdev up with an address and puts soft-RoCE device $1 on it.
add_rxe() { # rxe_name netdev cidr
    ip addr add "$3" dev "$2" && ip link set "$2" up \
        && rdma link add "$1" type rxe netdev "$2" \
        || fail "cannot create $1 on $2 ($3)"
}

log "rdma modules loaded"
if [[ "${LAB_ARP_STRICT:-}" == 1 ]]; then # several NICs in one subnet: each answers ARP for its own address only
    sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
        net.ipv4.conf.default.arp_ignore=1 net.ipv4.conf.default.arp_announce=2 || fail "cannot set arp_ignore/arp_announce"
fi
if [[ "$LAB_MODE" == node ]]; then
    # LAB_NICS: "mac,cidr,rxe_name ..." — found by MAC, not by probe order.
    modprobe virtio_net || fail "modprobe virtio_net failed"
    for spec in $LAB_NICS; do
        IFS=, read -r mac cidr rxe <<<"$spec"
        nic=""
        for _ in $(seq 50); do # NICs appear asynchronously after the probe
            nic=$(grep -l "^$mac\$" /sys/class/net/*/address 2>/dev/null | head -1)
            [[ -n "$nic" ]] && break
            sleep 0.1
        done
        [[ -n "$nic" ]] || fail "no virtio NIC with MAC $mac appeared"
        nic=${nic%/address}
        add_rxe "$rxe" "${nic##*/}" "$cidr"
    done
else
    # rxe loops back within one device; two dummies give two devices to stripe
    # over (each device only reaches itself: traffic between the two is routed
    # through lo, where rxe drops it).
    modprobe dummy numdummies=0 || fail "modprobe dummy failed"
    ip link add dummy0 type dummy && ip link add dummy1 type dummy \
        || fail "cannot create dummy netdevs"
    add_rxe rxe0 dummy0 10.77.0.1/24
    add_rxe rxe1 dummy1 10.77.0.2/24
fi

for dev in /sys/class/infiniband/*; do
    ok=""
    for _ in $(seq 100); do
        grep -q ACTIVE "$dev/ports/1/state" 2>/dev/null && { ok=1; break; }
        sleep 0.1
    done
    [[ -n "$ok" ]] || fail "${dev##*/} port never became ACTIVE"
done
log "rdma devices: $(ls /sys/class/infiniband | tr '\n' ' ')"

ulimit -l unlimited
ulimit -n 65536 2>/dev/null

cd "$LAB_CWD" || fail "cannot cd to $LAB_CWD"
mapfile -d '' -t envs <"$LAB/cmd.env"
mapfile -d '' -t argv <"$LAB/cmd.argv"
cut -d' ' -f1 /proc/uptime >"$LAB/t_cmd_start"
log "running: ${argv[*]}"
env -i "${envs[@]}" "${argv[@]}" </dev/null >>"$LAB/stdout" 2>>"$LAB/stderr"
rc=$?
cut -d' ' -f1 /proc/uptime >"$LAB/t_cmd_end"
log "command exited with $rc"
finish "$rc"
