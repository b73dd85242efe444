#!/usr/bin/env bash
# RDMA lab: a real kernel soft-RoCE (rdma_rxe) stack on machines whose own
# kernel has no RDMA, by booting Debian's stock kernel under QEMU (TCG) with
# the host's root filesystem shared read-only over virtio-9p.
# See scripts/rdma_lab/README.md. Usage: lab.sh help
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
CACHE=${ARXTUNE_LAB_CACHE:-$REPO_ROOT/.cache/rdma-lab}

# pyverbs is not among them: the project's venv has the rdma extra's (make venv-rdma).
APT_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-utils ibverbs-providers
    perftest iproute2 kmod cpio gzip xz-utils)
# Modules the initramfs needs to reach the host root; deps come from modules.dep.
INITRD_MODULES=(virtio_pci 9pnet_virtio 9p overlay)
# Environment passed to the command in the guest, besides ARXTUNE_* and PYTHON*.
PASS_ENV=(PATH HOME USER LOGNAME TERM LANG LC_ALL TZ VIRTUAL_ENV CI)

DEFAULT_MEM=4096
DEFAULT_TIMEOUT=1800

die() { echo "lab: $*" >&2; exit 1; }
note() { echo "lab: $*" >&2; }

usage() {
    cat <<EOF
usage: scripts/rdma_lab/lab.sh COMMAND
  setup                          install packages, fetch+unpack the guest kernel, build the initramfs (idempotent)
  run  [OPTS] -- CMD...          boot one guest (rxe0 on dummy0 10.77.0.1, rxe1 on dummy1 10.77.0.2), run CMD in \$PWD
  run2 [OPTS] -- CMD...          boot two guests linked by QEMU UDP sockets: rxe0 on eth0 (10.77.1.1 / .2),
                                 rxe1 on eth1 (10.77.2.1 / .2); NODE_RANK, NNODES, MASTER_ADDR, MASTER_PORT set
  run3 [OPTS] -- CMD...          boot three guests, each with a ring (rxe0, rxe1: one UDP cable and subnet per pair of
                                 guests) and a switch (rxe2, rxe3 on one multicast segment and subnet 10.77.40.0/24);
                                 NODE_RANK, NNODES=3, MASTER_ADDR (switch), MASTER_PORT set
  selftest                       ibv_devices, rdma link, ibv_devinfo, ib_write_lat (1 and 2 guests), the venv's pyverbs
  ib-write-lat [--two-node]      print ib_write_lat_2B_us=<typical> measured in a guest
  clean                          delete the cache ($CACHE)
OPTS: --mem MB (default $DEFAULT_MEM)  --timeout S (default $DEFAULT_TIMEOUT)  --smp N  --env NAME[=VALUE] (repeatable)
Cache: \$ARXTUNE_LAB_CACHE (default <repo>/.cache/rdma-lab)
EOF
}

# ---------------------------------------------------------------- setup ----

missing_pkgs() {
    local p
    for p in "${APT_PKGS[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"
    done
}

APT_UPDATED=""
apt_update_once() {
    [[ -n "$APT_UPDATED" ]] && return 0
    note "apt-get update"
    apt-get update -qq >/dev/null || die "apt-get update failed: check network access to the Debian mirror"
    APT_UPDATED=1
}

install_pkgs() {
    local -a missing
    mapfile -t missing < <(missing_pkgs)
    ((${#missing[@]})) || return 0
    [[ $EUID -eq 0 ]] || die "packages missing (${missing[*]}): run lab.sh setup as root"
    apt_update_once
    note "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install failed: run 'apt-get install ${missing[*]}' by hand to see why"
}

# The concrete flavour package behind linux-image-amd64 (-cloud lacks rdma_rxe and 9p).
kernel_pkg() {
    if [[ -n "${ARXTUNE_LAB_KERNEL_PKG:-}" ]]; then echo "$ARXTUNE_LAB_KERNEL_PKG"; return; fi
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    if [[ -z "$pkg" ]]; then
        apt_update_once
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    fi
    [[ "$pkg" == linux-image-*-amd64 && "$pkg" != *cloud* ]] \
        || die "cannot resolve linux-image-amd64 to a kernel package: set ARXTUNE_LAB_KERNEL_PKG=linux-image-X-amd64"
    echo "$pkg"
}

fetch_kernel() { # pkg -> unpacks into $CACHE/kernel, runs depmod
    local pkg=$1 dl=$CACHE/dl
    rm -rf "$dl" "$CACHE/kernel.tmp"
    mkdir -p "$dl"
    # Let apt's sandbox user write here, else apt warns about downloading as root.
    chown _apt "$dl" 2>/dev/null || true
    note "apt-get download $pkg"
    (cd "$dl" && apt-get download -q "$pkg" >/dev/null 2>&1) || {
        apt_update_once
        (cd "$dl" && apt-get download -q "$pkg" >/dev/null) || die "apt-get download $pkg failed: check the Debian mirror or set ARXTUNE_LAB_KERNEL_PKG"
    }
    dpkg -x "$dl"/*.deb "$CACHE/kernel.tmp" || die "dpkg -x of $pkg failed: delete $CACHE and retry"
    local kv
    kv=$(ls "$CACHE/kernel.tmp/lib/modules")
    [[ -n "$kv" && -f "$CACHE/kernel.tmp/boot/vmlinuz-$kv" ]] || die "$pkg has no vmlinuz/modules: not a kernel image package?"
    # The package has no modules.dep (made by depmod at install time); make it here.
    depmod -b "$CACHE/kernel.tmp" "$kv" || die "depmod for $kv failed: is kmod installed?"
    rm -rf "$CACHE/kernel" "$dl"
    mv "$CACHE/kernel.tmp" "$CACHE/kernel"
}

# vmlinuz is a self-decompressing bzImage; decompressing it under TCG costs
# seconds every boot, so unpack the ELF once. QEMU boots it via its PVH note.
extract_vmlinux() { # bzimage out
    local img=$1 out=$2 magic tool off
    for magic in 'xz:\xfd7zXZ\x00' 'gzip:\x1f\x8b\x08' 'zstd:\x28\xb5\x2f\xfd'; do
        tool=${magic%%:*}
        command -v "$tool" >/dev/null || continue
        for off in $(LC_ALL=C grep -obUaP "${magic#*:}" "$img" | cut -d: -f1 | head -5); do
            # Trailing bytes after the stream make the decompressor complain: ignore.
            tail -c +$((off + 1)) "$img" | "$tool" -dc >"$out.tmp" 2>/dev/null || true
            if [[ "$(head -c 4 "$out.tmp" | od -An -c | tr -d ' ')" == 177ELF ]]; then
                mv -f "$out.tmp" "$out"
                return 0
            fi
        done
    done
    rm -f "$out.tmp"
    return 1
}

# Module files for the initramfs, dependencies first, from modules.dep.
module_order() { # kmoddir module...
    local dir=$1
    shift
    local -A seen=()
    local -a order=()
    visit() {
        local rel=$1 dep line
        [[ -n "${seen[$rel]:-}" ]] && return 0
        seen[$rel]=1
        line=$(grep -m1 "^$rel:" "$dir/modules.dep") || die "module $rel not in modules.dep"
        for dep in ${line#*:}; do visit "$dep"; done
        order+=("$rel")
    }
    local m rel
    for m in "$@"; do
        rel=$(grep -m1 -E "(^|/)$m\.ko(\.[a-z]+)?:" "$dir/modules.dep" | cut -d: -f1) \
            || die "module $m not found in $dir/modules.dep"
        visit "$rel"
    done
    printf '%s\n' "${order[@]}"
}

initrd_hash() { # what the initramfs is built from
    cat "$SCRIPT_DIR/initramfs-init" /bin/busybox | sha256sum | cut -c1-16
}

build_initramfs() { # kv
    local kv=$1 kdir=$CACHE/kernel/lib/modules/$1 root=$CACHE/initramfs.d rel a
    rm -rf "$root"
    mkdir -p "$root"/{bin,dev,proc,sys,modules}
    cp /bin/busybox "$root/bin/busybox"
    for a in sh mount umount insmod mkdir switch_root echo cat cut sleep reboot poweroff; do
        ln -s busybox "$root/bin/$a"
    done
    local order
    order=$(module_order "$kdir" "${INITRD_MODULES[@]}") || exit 1
    : >"$root/modules/order"
    for rel in $order; do
        [[ "$rel" == *.ko ]] || die "compressed module $rel: teach build_initramfs to decompress it"
        cp "$kdir/$rel" "$root/modules/"
        basename "$rel" >>"$root/modules/order"
    done
    install -m 755 "$SCRIPT_DIR/initramfs-init" "$root/init"
    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$CACHE/initramfs.tmp"
    mv -f "$CACHE/initramfs.tmp" "$CACHE/initramfs.cpio.gz"
    rm -rf "$root"
}

setup_complete() {
    [[ -f "$CACHE/setup.env" ]] || return 1
    # shellcheck source=/dev/null
    source "$CACHE/setup.env"
    [[ -f "$LAB_IMAGE" && -f "$CACHE/initramfs.cpio.gz" && -f "$LAB_KMOD_DIR/modules.dep" ]] || return 1
    [[ "$LAB_INITRD_HASH" == "$(initrd_hash)" && "${LAB_HZ:-}" =~ ^[0-9]+$ ]] || return 1
    [[ -z "$(missing_pkgs)" ]]
}

cmd_setup() {
    local t0=$SECONDS
    if setup_complete; then
        note "setup: cache complete, nothing to do ($CACHE)"
        return 0
    fi
    mkdir -p "$CACHE"
    # Parallel first runs (make -j) must not build the cache twice at once.
    exec 9>"$CACHE/.setup.lock"
    flock -w 900 9 || die "another lab.sh setup has held $CACHE/.setup.lock for 15 min: stop it, then retry"
    if setup_complete; then
        exec 9>&-
        note "setup: cache completed by another lab.sh, nothing to do ($CACHE)"
        return 0
    fi
    # The cache lives in the repo tree: keep git from ever seeing it.
    [[ -f "$CACHE/.gitignore" ]] || echo '*' >"$CACHE/.gitignore"
    install_pkgs
    local pkg kv
    pkg=$(kernel_pkg)
    if [[ ! -f "$CACHE/kernel.pkg" || "$(cat "$CACHE/kernel.pkg")" != "$pkg" || ! -d "$CACHE/kernel" ]]; then
        rm -f "$CACHE/setup.env" "$CACHE/kernel.pkg" "$CACHE/vmlinux"
        fetch_kernel "$pkg"
        echo "$pkg" >"$CACHE/kernel.pkg"
    fi
    kv=$(ls "$CACHE/kernel/lib/modules")
    local image=$CACHE/vmlinux
    if [[ "${ARXTUNE_LAB_KERNEL_IMAGE:-vmlinux}" == bzimage ]]; then
        image=$CACHE/kernel/boot/vmlinuz-$kv
    elif [[ ! -f "$image" ]] && ! extract_vmlinux "$CACHE/kernel/boot/vmlinuz-$kv" "$image"; then
        note "could not decompress vmlinuz, booting the bzImage (slower)"
        image=$CACHE/kernel/boot/vmlinuz-$kv
    fi
    build_initramfs "$kv"
    cat >"$CACHE/setup.env" <<EOF
LAB_KPKG=$pkg
LAB_KV=$kv
LAB_KMOD_DIR=$CACHE/kernel/lib/modules/$kv
LAB_IMAGE=$image
LAB_INITRD_HASH=$(initrd_hash)
LAB_HZ=$(sed -n 's/^CONFIG_HZ=//p' "$CACHE/kernel/boot/config-$kv")
EOF
    exec 9>&-
    note "setup: done in $((SECONDS - t0))s (kernel $kv, image ${image##*/}, cache $CACHE)"
}

ensure_setup() {
    setup_complete || cmd_setup
    # shellcheck source=/dev/null
    source "$CACHE/setup.env"
}

# ----------------------------------------------------------------- boot ----

MEM=$DEFAULT_MEM TIMEOUT=$DEFAULT_TIMEOUT SMP="" EXTRA_ENV=() CMD=()
parse_run_opts() {
    while (($#)); do
        case "$1" in
        --mem) MEM=${2:?--mem needs MB}; shift 2 ;;
        --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
        --smp) SMP=${2:?--smp needs a count}; shift 2 ;;
        --env) EXTRA_ENV+=("${2:?--env needs NAME or NAME=VALUE}"); shift 2 ;;
        --) shift; break ;;
        *) die "unknown option $1: usage lab.sh run [--mem MB] [--timeout S] [--smp N] [--env NAME[=VAL]] -- CMD..." ;;
        esac
    done
    (($#)) || die "no command given: usage lab.sh run [OPTS] -- CMD..."
    [[ "$MEM" =~ ^[0-9]+$ && "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--mem and --timeout take whole numbers"
    CMD=("$@")
}

TSC_KHZ=""
new_run_dir() {
    mkdir -p "$CACHE/runs"
    TSC_KHZ=$(host_tsc_khz)
    # Keep the newest 20 runs' logs; never touch one that may still be running.
    local old
    for old in $(ls -1dt "$CACHE"/runs/2* 2>/dev/null | tail -n +20); do
        [[ -n "$(find "$old" -maxdepth 0 -mmin +240)" ]] && rm -rf "$old"
    done
    RUN=$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$$
    mkdir -p "$RUN"
    ln -sfn "$RUN" "$CACHE/runs/last"
}

# Writes a node's share: guest init, lab settings, NUL-separated env and argv.
prepare_node() { # dir mode rank node_ip [NAME=VALUE...]
    local dir=$1 mode=$2 rank=$3 ip=$4
    shift 4
    mkdir -p "$dir"
    install -m 755 "$SCRIPT_DIR/guest-init.sh" "$dir/guest-init.sh"
    {
        printf 'LAB_KV=%q\nLAB_KMOD_DIR=%q\nLAB_CWD=%q\n' "$LAB_KV" "$LAB_KMOD_DIR" "$PWD"
        printf 'LAB_MODE=%q\nLAB_RANK=%q\nLAB_NODE_IP=%q\n' "$mode" "$rank" "$ip"
        printf 'LAB_CWD_CACHE=%q\n' "${ARXTUNE_LAB_CWD_CACHE:-mmap}"
    } >"$dir/env.sh"
    local -A env=()
    local name kv
    for name in "${PASS_ENV[@]}" $(compgen -e | grep -E '^(ARXTUNE_|PYTHON)' || true); do
        [[ -n "${!name+x}" ]] && env[$name]=${!name}
    done
    [[ -n "${env[PATH]:-}" ]] || env[PATH]=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    for kv in "${EXTRA_ENV[@]}"; do
        if [[ "$kv" == *=* ]]; then env[${kv%%=*}]=${kv#*=}; elif [[ -n "${!kv+x}" ]]; then env[$kv]=${!kv}; fi
    done
    for kv in "$@"; do env[${kv%%=*}]=${kv#*=}; done
    : >"$dir/cmd.env"
    for name in "${!env[@]}"; do printf '%s=%s\0' "$name" "${env[$name]}" >>"$dir/cmd.env"; done
    printf '%s\0' "${CMD[@]}" >"$dir/cmd.argv"
    : >"$dir/stdout"
    : >"$dir/stderr"
    rm -f "$dir/rc"
}

# The guest's RDTSC is the host's TSC; the guest calibrating it against the
# emulated PIT goes wrong on a busy host (clock and perftest ~15x off), so
# measure it here once per host boot and hand it over as tsc_early_khz=.
host_tsc_khz() {
    local f=$CACHE/tsc_khz boot khz
    boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo none)
    if [[ -f "$f" && "$(cut -d' ' -f1 "$f")" == "$boot" ]]; then
        cut -s -d' ' -f2 "$f"
        return 0
    fi
    khz=$(python3 "$SCRIPT_DIR/tsc_khz.py" 2>/dev/null || true)
    echo "$boot $khz" >"$f"
    echo "$khz"
}

# Starts QEMU for one node in the background; sets QPID.
boot_node() { # dir smp [qemu net args...]
    local dir=$1 smp=$2
    shift 2
    # mitigations=off: speculative-execution workarounds only cost time under TCG.
    local append="console=ttyS0 panic=-1 mitigations=off tsc=reliable no_timer_check"
    # lpj= skips the secondary CPUs' delay-loop calibration (seconds under TCG).
    [[ -z "$TSC_KHZ" ]] || append+=" tsc_early_khz=$TSC_KHZ lpj=$((TSC_KHZ * 1000 / LAB_HZ))"
    append+=" ${ARXTUNE_LAB_KERNEL_ARGS:-}"
    local fs=security_model=none,multidevs=remap
    # QEMU option values escape a comma by doubling it.
    local d=${dir//,/,,} cwd=${PWD//,/,,}
    timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
        -nodefaults -no-user-config -display none -no-reboot \
        -machine q35 -accel tcg,thread=multi -cpu max -smp "$smp" -m "$MEM" \
        -kernel "$LAB_IMAGE" -initrd "$CACHE/initramfs.cpio.gz" -append "$append" \
        -chardev "file,id=con,path=$d/console.log" -serial chardev:con \
        -fsdev "local,id=fsroot,path=/,readonly=on,$fs" -device virtio-9p-pci,fsdev=fsroot,mount_tag=hostroot \
        -fsdev "local,id=fslab,path=$d,$fs" -device virtio-9p-pci,fsdev=fslab,mount_tag=lab \
        -fsdev "local,id=fscwd,path=$cwd,$fs" -device virtio-9p-pci,fsdev=fscwd,mount_tag=cwd \
        "$@" </dev/null >"$dir/qemu.log" 2>&1 &
    QPID=$!
}

# Streams a node's stdout/stderr files to ours until its QEMU is gone.
STREAM_PIDS=()
stream_node() { # dir qpid prefix
    local dir=$1 pid=$2 prefix=$3
    if [[ -n "$prefix" ]]; then
        tail -n +1 -s 0.2 -f --pid="$pid" "$dir/stdout" | sed -u "s/^/$prefix /" &
        STREAM_PIDS+=($!)
        tail -n +1 -s 0.2 -f --pid="$pid" "$dir/stderr" | sed -u "s/^/$prefix /" >&2 &
        STREAM_PIDS+=($!)
    else
        tail -n +1 -s 0.2 -f --pid="$pid" "$dir/stdout" &
        STREAM_PIDS+=($!)
        tail -n +1 -s 0.2 -f --pid="$pid" "$dir/stderr" >&2 &
        STREAM_PIDS+=($!)
    fi
}

QEMU_PIDS=()
cleanup() {
    local p
    for p in "${QEMU_PIDS[@]}" "${STREAM_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# Exit status of one node after its QEMU ended; prints a one-line reason on failure.
node_rc() { # dir qemu_status label
    local dir=$1 qs=$2 label=$3
    if [[ -s "$dir/rc" ]]; then
        cat "$dir/rc"
    elif ((qs == 124 || qs == 137)); then
        echo "lab: $label timed out after ${TIMEOUT}s and was killed (raise --timeout); console: $dir/console.log" >&2
        echo 124
    else
        echo "lab: $label ended without an exit code (QEMU status $qs); see $dir/console.log and $dir/qemu.log" >&2
        tail -n 5 "$dir/qemu.log" "$dir/console.log" 2>/dev/null | sed 's/^/lab:   /' >&2
        echo 125
    fi
}

wait_streams() {
    # tail --pid notices QEMU's exit within a second; never wait forever.
    local p deadline=$((SECONDS + 5))
    for p in "${STREAM_PIDS[@]}"; do
        while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        kill "$p" 2>/dev/null || true
    done
    STREAM_PIDS=()
}

timing_line() { # dir label wall_s
    local start="?" end="?"
    [[ -s "$1/t_cmd_start" ]] && start=$(cat "$1/t_cmd_start")
    [[ -s "$1/t_cmd_end" ]] && end=$(cat "$1/t_cmd_end")
    echo "$2: boot-to-command ${start}s (guest uptime), command end ${end}s, wall ${3}s; console: $1/console.log" >"$1/timing"
    [[ -n "${ARXTUNE_LAB_QUIET:-}" ]] || note "$(cat "$1/timing")"
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

cmd_run() {
    parse_run_opts "$@"
    ensure_setup
    [[ "$PWD" != / ]] || die "run from a project directory, not /: the cwd is shared read-write into the guest"
    new_run_dir
    local dir=$RUN/node0
    prepare_node "$dir" single 0 10.77.0.1 ARXTUNE_LAB_GUEST=1 ARXTUNE_LAB_NODE_IP=10.77.0.1 \
        "ARXTUNE_LAB_RDMA_DEVS=rxe0 rxe1"
    local t0 qs=0
    t0=$(now)
    boot_node "$dir" "${SMP:-2}" -nic none
    QEMU_PIDS=("$QPID")
    stream_node "$dir" "$QPID" ""
    wait "$QPID" || qs=$?
    QEMU_PIDS=()
    wait_streams
    cp -f "$dir/console.log" "$CACHE/last-console.log" 2>/dev/null || true
    timing_line "$dir" node0 "$(elapsed "$t0")"
    local rc
    rc=$(node_rc "$dir" "$qs" guest)
    exit "$rc"
}

free_udp_ports() { # prints N free UDP ports on 127.0.0.1
    python3 -c '
import socket, sys
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))' "$1"
}

cmd_run2() {
    parse_run_opts "$@"
    ensure_setup
    [[ "$PWD" != / ]] || die "run from a project directory, not /: the cwd is shared read-write into the guests"
    new_run_dir
    local ports r ip nics dirs=() qpids=() t0
    read -r -a ports < <(free_udp_ports 4) || die "cannot find free UDP ports on 127.0.0.1"
    ((${#ports[@]} == 4)) || die "cannot find free UDP ports on 127.0.0.1 (is python3 installed?)"
    t0=$(now)
    for r in 0 1; do
        ip=10.77.1.$((r + 1))
        # Two rails, like a two-NIC node: rxe0 on 10.77.1.0/24, rxe1 on 10.77.2.0/24.
        nics="52:54:00:77:01:0$((r + 1)),$ip/24,rxe0 52:54:00:77:02:0$((r + 1)),10.77.2.$((r + 1))/24,rxe1"
        prepare_node "$RUN/node$r" node "$r" "$ip" NODE_RANK=$r NNODES=2 MASTER_ADDR=10.77.1.1 \
            MASTER_PORT=29577 ARXTUNE_LAB_NODE_IP=$ip ARXTUNE_LAB_NODE_IP2=10.77.2.$((r + 1)) \
            ARXTUNE_LAB_GUEST=1 "ARXTUNE_LAB_RDMA_DEVS=rxe0 rxe1"
        printf 'LAB_NICS=%q\n' "$nics" >>"$RUN/node$r/env.sh"
        dirs+=("$RUN/node$r")
    done
    # Point-to-point UDP "wires" between the guests' virtio NICs, on loopback
    # only: rail 0 uses ports[0]/[1], rail 1 ports[2]/[3]; each side listens
    # on its own port and sends to the other's.
    local me peer rail args
    for r in 0 1; do
        args=()
        for rail in 0 1; do
            me=${ports[$((2 * rail + r))]} peer=${ports[$((2 * rail + 1 - r))]}
            args+=(-netdev "socket,id=r$rail,udp=127.0.0.1:$peer,localaddr=127.0.0.1:$me"
                -device "virtio-net-pci,netdev=r$rail,mac=52:54:00:77:0$((rail + 1)):0$((r + 1))")
        done
        boot_node "${dirs[$r]}" "${SMP:-1}" "${args[@]}"
        qpids+=("$QPID")
    done
    QEMU_PIDS=("${qpids[@]}")
    stream_node "${dirs[0]}" "${qpids[0]}" "[node0]"
    stream_node "${dirs[1]}" "${qpids[1]}" "[node1]"
    local qs0=0 qs1=0 rc0 rc1
    wait "${qpids[0]}" || qs0=$?
    wait "${qpids[1]}" || qs1=$?
    QEMU_PIDS=()
    wait_streams
    for r in 0 1; do cp -f "${dirs[$r]}/console.log" "$CACHE/last-console-node$r.log" 2>/dev/null || true; done
    timing_line "${dirs[0]}" node0 "$(elapsed "$t0")"
    timing_line "${dirs[1]}" node1 "$(elapsed "$t0")"
    rc0=$(node_rc "${dirs[0]}" "$qs0" node0)
    rc1=$(node_rc "${dirs[1]}" "$qs1" node1)
    ((rc0 == 0)) || exit "$rc0"
    exit "$rc1"
}

# Three guests, four NICs each (soft-RoCE on every one):
#   ring:   rxe0 of guest g and rxe1 of guest g+1 share cable g (QEMU UDP sockets, point to point),
#           subnet 10.77.(30+g).0/24, g at .1, g+1 at .2: each peer is reached through one device only.
#   switch: rxe2 and rxe3 of every guest on one segment (QEMU socket netdev, multicast on 127.0.0.1),
#           one subnet 10.77.40.0/24 (guest g: .(g+1) and .(g+11)); torchrun and gloo use rxe2's netdev.
# Two NICs in one subnet must answer ARP only for their own address (arp_ignore=1, arp_announce=2),
# else a peer may send rxe2's traffic to rxe3's MAC, where no queue pair knows it.
cmd_run3() {
    parse_run_opts "$@"
    ensure_setup
    [[ "$PWD" != / ]] || die "run from a project directory, not /: the cwd is shared read-write into the guests"
    new_run_dir
    local ports g prev link me peer args nics dirs=() qpids=() t0 group mport
    read -r -a ports < <(free_udp_ports 7) || die "cannot find free UDP ports on 127.0.0.1"
    ((${#ports[@]} == 7)) || die "cannot find free UDP ports on 127.0.0.1 (is python3 installed?)"
    mport=${ports[6]} group=239.77.$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1))
    t0=$(now)
    for g in 0 1 2; do
        prev=$(((g + 2) % 3))
        nics="52:54:00:78:00:0$g,10.77.$((30 + g)).1/24,rxe0 52:54:00:78:01:0$g,10.77.$((30 + prev)).2/24,rxe1"
        nics+=" 52:54:00:78:02:0$g,10.77.40.$((g + 1))/24,rxe2 52:54:00:78:03:0$g,10.77.40.$((g + 11))/24,rxe3"
        prepare_node "$RUN/node$g" node "$g" "10.77.40.$((g + 1))" NODE_RANK=$g NNODES=3 MASTER_ADDR=10.77.40.1 \
            MASTER_PORT=29577 ARXTUNE_LAB_NODE_IP=10.77.40.$((g + 1)) ARXTUNE_LAB_GUEST=1 \
            "ARXTUNE_LAB_RDMA_DEVS=rxe0 rxe1 rxe2 rxe3"
        printf 'LAB_NICS=%q\nLAB_ARP_STRICT=1\n' "$nics" >>"$RUN/node$g/env.sh"
        dirs+=("$RUN/node$g")
    done
    # cable c: guest c's first NIC listens on ports[2c] and sends to ports[2c+1], guest c+1's second NIC the reverse
    for g in 0 1 2; do
        prev=$(((g + 2) % 3))
        args=(-netdev "socket,id=a,udp=127.0.0.1:${ports[$((2 * g + 1))]},localaddr=127.0.0.1:${ports[$((2 * g))]}"
            -device "virtio-net-pci,netdev=a,mac=52:54:00:78:00:0$g"
            -netdev "socket,id=b,udp=127.0.0.1:${ports[$((2 * prev))]},localaddr=127.0.0.1:${ports[$((2 * prev + 1))]}"
            -device "virtio-net-pci,netdev=b,mac=52:54:00:78:01:0$g")
        for link in 2 3; do
            args+=(-netdev "socket,id=s$link,mcast=$group:$mport,localaddr=127.0.0.1"
                -device "virtio-net-pci,netdev=s$link,mac=52:54:00:78:0$link:0$g")
        done
        boot_node "${dirs[$g]}" "${SMP:-1}" "${args[@]}"
        qpids+=("$QPID")
    done
    QEMU_PIDS=("${qpids[@]}")
    for g in 0 1 2; do stream_node "${dirs[$g]}" "${qpids[$g]}" "[node$g]"; done
    local qs=() rc first=0
    for g in 0 1 2; do
        qs[g]=0
        wait "${qpids[$g]}" || qs[g]=$?
    done
    QEMU_PIDS=()
    wait_streams
    for g in 0 1 2; do
        cp -f "${dirs[$g]}/console.log" "$CACHE/last-console-node$g.log" 2>/dev/null || true
        timing_line "${dirs[$g]}" "node$g" "$(elapsed "$t0")"
    done
    for g in 0 1 2; do
        rc=$(node_rc "${dirs[$g]}" "${qs[$g]}" "node$g")
        ((first != 0)) || first=$rc
    done
    exit "$first"
}

# ------------------------------------------------------------- commands ----

cmd_ib_write_lat() {
    local two=""
    [[ "${1:-}" == --two-node ]] && two=1
    if [[ -n "$two" ]]; then
        ARXTUNE_LAB_QUIET=1 "$SCRIPT_DIR/lab.sh" run2 --timeout 600 -- bash "$SCRIPT_DIR/floor.sh" --peer \
            | sed -n 's/^\[node1\] //p' | grep '^ib_write_lat_'
    else
        ARXTUNE_LAB_QUIET=1 "$SCRIPT_DIR/lab.sh" run --timeout 600 -- bash "$SCRIPT_DIR/floor.sh"
    fi
}

cmd_selftest() {
    cmd_setup
    local rc=0 t0
    note "selftest: one guest"
    t0=$SECONDS
    "$SCRIPT_DIR/lab.sh" run --timeout 900 -- bash "$SCRIPT_DIR/selftest-guest.sh" "${ARXTUNE_PYTHON:-$REPO_ROOT/.venv/bin/python}" || rc=$?
    note "selftest: one guest finished with $rc in $((SECONDS - t0))s"
    note "selftest: two guests (run2), ib_write_lat across the socket link"
    t0=$SECONDS
    local rc2=0
    "$SCRIPT_DIR/lab.sh" run2 --timeout 900 -- bash "$SCRIPT_DIR/selftest-guest.sh" --two-node || rc2=$?
    note "selftest: two guests finished with $rc2 in $((SECONDS - t0))s"
    if ((rc == 0 && rc2 == 0)); then
        note "selftest: PASS"
    else
        die "selftest: FAIL (one guest rc=$rc, two guests rc=$rc2); logs under $CACHE/runs"
    fi
}

main() {
    local cmd=${1:-help}
    (($#)) && shift
    case "$cmd" in
    setup) cmd_setup ;;
    run) cmd_run "$@" ;;
    run2) cmd_run2 "$@" ;;
    run3) cmd_run3 "$@" ;;
    selftest) cmd_selftest ;;
    ib-write-lat) cmd_ib_write_lat "$@" ;;
    clean) rm -rf "$CACHE" && note "removed $CACHE" ;;
    help | -h | --help) usage ;;
    *) usage >&2; die "unknown command $cmd" ;;
    esac
}

main "$@"
