#!/usr/bin/env bash
# `arxtune doctor` across the two lab guests (lab.sh run2), in three states of the fabric, then
# perftest's floor on the same guests. Runs in BOTH guests; per case writes, under OUT:
#   <case>.node<N>.txt  doctor's output     <case>.node<N>.rc  its exit code
#   <case>.tgz          the --report archive (rank 0)
# and floor.node<N>.txt (ib_write_lat 2 B and 16 KiB, each rail; node1's lines are the client's).
# Cases, changed inside the guests at run time:
#   healthy  MTU 9000 on both rails of both guests
#   gid      node1's eth0 gets an IPv6 address before its IPv4 one, so its IPv4 GID moves from index 1 to 2
#   mtu      node1's eth0 back to MTU 1500 (active MTU 1024 against node0's 4096)
# Usage (inside run2): doctor-cases.sh OUT_DIR
set -u
out=${1:?usage: doctor-cases.sh OUT_DIR}
py=${ARXTUNE_PYTHON:-.venv/bin/python}
node=${NODE_RANK:?run this under lab.sh run2}
me=$((node + 1))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
# gloo binds the NIC that carries this node's address, not whatever the hostname resolves to.
GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v ip="$ARXTUNE_LAB_NODE_IP" 'index($4, ip "/") == 1 {print $2; exit}')
export GLOO_SOCKET_IFNAME PYTHONUNBUFFERED=1

# Each guest starts its rank itself, with the variables torchrun would give it: torchrun's own agent is
# one more Python start (a minute under the software CPU); the launcher and torchrun paths are the
# multiproc tier's (tests/multiproc/test_doctor_group.py).
doctor() { # case port
    RANK=$node WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_PORT=$2 \
        "$py" -m arxtune doctor --timeout-s 600 --report "$out/$1.tgz" >"$out/$1.node$node.txt" 2>&1
    echo $? >"$out/$1.node$node.rc"
    echo "doctor-cases: $1 done, exit $(cat "$out/$1.node$node.rc")"
}

ip link set dev eth0 mtu 9000 && ip link set dev eth1 mtu 9000
doctor healthy 29601
# perftest's floor on the same guests in the same state, right after the healthy ping-pong
for dev in rxe0 rxe1; do
    for size in 2 16384; do
        bash "$here/floor.sh" --peer -d "$dev" -s "$size" -n 500 -t 300 | sed "s/^/$dev /" >>"$out/floor.node$node.txt"
    done
done
echo "doctor-cases: floor done"

if ((node == 1)); then # the IPv6 GID takes index 1 first; the IPv4 one comes back at 2
    ip addr del "10.77.1.$me/24" dev eth0
    ip -6 addr add "fd77:1::$me/64" dev eth0 nodad
    ip addr add "10.77.1.$me/24" dev eth0
    sleep 1
fi
doctor gid 29602
if ((node == 1)); then # back to index 1: both addresses leave, the IPv4 one returns to the lowest free slot
    ip -6 addr del "fd77:1::$me/64" dev eth0
    ip addr del "10.77.1.$me/24" dev eth0
    ip addr add "10.77.1.$me/24" dev eth0
    sleep 1
fi

((node == 1)) && ip link set dev eth0 mtu 1500
doctor mtu 29603
ip link set dev eth0 mtu 9000

