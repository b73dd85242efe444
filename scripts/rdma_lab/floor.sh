#!/usr/bin/env bash
# Fabric floor: perftest ib_write_lat on a soft-RoCE device, run INSIDE a lab
# guest (lab.sh run / run2). Prints one machine-parseable line on stdout:
#   ib_write_lat_<size>B_us=<t_typical in microseconds>
#
#   floor.sh              server+client on the local device (loopback)
#   floor.sh --peer       two guests (lab.sh run2): NODE_RANK 0 serves, 1 connects
#                         to MASTER_ADDR; both print the line
# Options: -d DEV (rxe0)  -s BYTES (2)  -n ITERS (1000)  -t TIMEOUT_S (120)
#          -q (print only the number)
set -euo pipefail

dev=rxe0 size=2 iters=1000 tmo=120 peer="" quiet=""
while (($#)); do
    case "$1" in
    -d) dev=$2; shift 2 ;;
    -s) size=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -t) tmo=$2; shift 2 ;;
    -q) quiet=1; shift ;;
    --peer) peer=1; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "floor.sh: unknown argument $1 (see floor.sh --help)" >&2; exit 2 ;;
    esac
done

die() { echo "floor.sh: $*" >&2; exit 1; }
command -v ib_write_lat >/dev/null || die "ib_write_lat not found: install perftest (lab.sh setup does)"
[[ -d /sys/class/infiniband/$dev ]] || die "no RDMA device $dev: run inside a lab guest (scripts/rdma_lab/lab.sh run -- ...)"

# RoCE v2 GID of the device's IPv4 address; perftest's default (0) is the
# link-local RoCE v1 GID, which does not route between two guests.
gid_index() {
    local p=/sys/class/infiniband/$dev/ports/1 f i
    for f in "$p"/gids/*; do
        i=${f##*/}
        [[ "$(cat "$f" 2>/dev/null)" == 0000:0000:0000:0000:0000:ffff:* ]] || continue
        [[ "$(cat "$p/gid_attrs/types/$i" 2>/dev/null)" == "RoCE v2" ]] || continue
        echo "$i"
        return 0
    done
    return 1
}
gid=$(gid_index) || die "$dev has no RoCE v2 IPv4 GID: give its netdev an IPv4 address"

# -F: under emulation the CPU frequency check always "fails".
lat=(ib_write_lat -d "$dev" -i 1 -x "$gid" -s "$size" -n "$iters" -F)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The client retries until the server listens (the other guest may boot later).
client() { # server_addr port
    local deadline=$((SECONDS + tmo))
    while ((SECONDS < deadline)); do
        if timeout "$tmo" "${lat[@]}" -p "$2" "$1" >"$log" 2>&1; then return 0; fi
        # Only "server not listening yet" is worth a retry.
        grep -qi "connect" "$log" || return 1
        sleep 0.5
    done
    return 1
}

report() {
    # Result row: #bytes #iterations t_min t_max t_typical t_avg ...
    local v
    v=$(awk -v s="$size" '$1 == s && $2 ~ /^[0-9]+$/ && NF >= 5 { print $5; exit }' "$log")
    [[ -n "$v" ]] || { cat "$log" >&2; die "could not parse ib_write_lat output (shown above)"; }
    if [[ -n "$quiet" ]]; then echo "$v"; else echo "ib_write_lat_${size}B_us=$v"; fi
}

if [[ -z "$peer" ]]; then
    port=$((20000 + RANDOM % 10000))
    srvlog=$(mktemp)
    timeout "$tmo" "${lat[@]}" -p "$port" >"$srvlog" 2>&1 &
    srv=$!
    client 127.0.0.1 "$port" || { cat "$log" "$srvlog" >&2; rm -f "$srvlog"; kill "$srv" 2>/dev/null; die "ib_write_lat loopback on $dev failed (output above)"; }
    wait "$srv" || true
    rm -f "$srvlog"
    report
else
    : "${NODE_RANK:?--peer needs NODE_RANK (set by lab.sh run2)}" "${MASTER_ADDR:?--peer needs MASTER_ADDR}"
    # One port per device so back-to-back runs on rxe0 and rxe1 never collide.
    port=$((18515 + ${dev//[!0-9]/0}))
    if [[ "$NODE_RANK" == 0 ]]; then
        timeout "$tmo" "${lat[@]}" -p "$port" >"$log" 2>&1 \
            || { cat "$log" >&2; die "ib_write_lat server on $dev failed (output above)"; }
    else
        client "$MASTER_ADDR" "$port" || { cat "$log" >&2; die "ib_write_lat client to $MASTER_ADDR failed (output above)"; }
    fi
    report
fi
