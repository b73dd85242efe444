#!/usr/bin/env bash
# Guest half of `lab.sh selftest`.
#   selftest-guest.sh PYTHON         inside one guest (lab.sh run): PYTHON's pyverbs (the rdma extra) lists the devices
#   selftest-guest.sh --two-node     inside both guests (lab.sh run2)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fails=0

step() { # title cmd...
    local title=$1
    shift
    echo "=== $title"
    if "$@"; then echo "--- ok: $title"; else echo "--- FAIL: $title"; fails=$((fails + 1)); fi
}

probe='import sys, pyverbs.device as d
names = [x.name.decode() for x in d.get_device_list()]
print(sys.executable, sys.version.split()[0], "devices:", names)
assert "rxe0" in names, names'

if [[ "${1:-}" == --two-node ]]; then
    step "rdma link" rdma link
    step "ib_write_lat across guests on rxe0 (rail 10.77.1.0/24)" bash "$here/floor.sh" --peer -d rxe0
    step "ib_write_lat across guests on rxe1 (rail 10.77.2.0/24)" bash "$here/floor.sh" --peer -d rxe1
    echo "selftest-guest: $fails failed"
    exit $((fails > 0))
fi
python=${1:?usage: selftest-guest.sh PYTHON | --two-node}

step "ibv_devices" ibv_devices
step "rdma link" rdma link
step "ibv_devinfo -d rxe0" ibv_devinfo -d rxe0
step "ib_write_lat -s 2 -n 1000 on rxe0 (loopback)" bash "$here/floor.sh" -d rxe0
step "ib_write_lat -s 2 -n 1000 on rxe1 (loopback)" bash "$here/floor.sh" -d rxe1
step "pyverbs: $python (the rdma extra, make venv-rdma)" "$python" -c "$probe"

echo "selftest-guest: $fails failed"
((fails == 0))
