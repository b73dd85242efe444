#!/usr/bin/env bash
# The RDMA tier (make test-rdma): real soft-RoCE devices in QEMU guests.
#   1. lab.sh setup (idempotent: packages, guest kernel, initramfs)
#   2. ONE guest boot: pytest tests/rdma/device (transport, 2- and 3-rank
#      torchrun checks, arxtune sweep with arx/arx2, ib_write_lat floor, doctor)
#   3. ONE two-guest boot: torchrun --nnodes 2 across two kernels (mp_check.py --arxg), then `arxtune doctor`
#      across the two guests healthy, with a GID index made to differ and with an MTU mismatch
#      (scripts/rdma_lab/doctor-cases.sh), and perftest's floor beside its ping-pong (tests/rdma/device/doctor_cases_check.py)
#   4. ONE three-guest boot: three ranks on a ring and on a switch (world3_check.py:
#      reachability, an arx sweep and the communicator per topology; `arxtune show` prints the ring's run)
# pyverbs is the rdma extra's in the venv (make venv-rdma), imported from the guests through the shared root.
# Fails if anything fails or any RDMA test is skipped (ARXTUNE_REQUIRE_RDMA=1).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LAB=scripts/rdma_lab/lab.sh
PY=${ARXTUNE_PYTHON:-.venv/bin/python}
JUNIT=.cache/rdma-tier-junit.xml
DOCTOR_OUT=.cache/doctor-cases

bash "$LAB" setup || { echo "test-rdma: lab setup failed" >&2; exit 1; }
"$PY" -c 'import pyverbs.device, pyverbs; print("test-rdma: pyverbs", pyverbs.__file__)' \
    || { echo "test-rdma: pyverbs does not import from $PY: make venv-rdma installs the rdma extra" >&2; exit 1; }
export ARXTUNE_REQUIRE_RDMA=1
rm -f "$JUNIT"

rc=0
echo "test-rdma: [1/3] one guest: pytest tests/rdma/device"
bash "$LAB" run -- bash -c 'exec "$0" -m pytest -q -rfEs --durations=8 -p no:cacheprovider tests/rdma/device --junitxml="$1"' \
    "$PY" "$JUNIT" || rc=1
if [[ ! -s "$JUNIT" ]]; then
    echo "test-rdma: no test report ($JUNIT): the guest run did not get to pytest" >&2; rc=1
elif ! "$PY" - "$JUNIT" <<'PYEOF'
import sys, xml.etree.ElementTree as ET
total = {k: sum(int(s.get(k, 0)) for s in ET.parse(sys.argv[1]).getroot().iter("testsuite")) for k in ("tests", "skipped", "failures", "errors")}
print("test-rdma: junit", total)
sys.exit(1 if total["skipped"] or total["failures"] or total["errors"] or not total["tests"] else 0)
PYEOF
then
    echo "test-rdma: tests failed or were skipped (see above)" >&2; rc=1
fi

echo "test-rdma: [2/3] two guests: torchrun --nnodes 2 (arx, arx2 and arxg's verbs proxies across two kernels, two rails), then doctor"
rm -rf "$DOCTOR_OUT"
# gloo must bind the NIC that carries this node's address, not whatever the hostname resolves to.
bash "$LAB" run2 -- bash -c '
    export GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v ip="$ARXTUNE_LAB_NODE_IP" "index(\$4, ip \"/\") == 1 {print \$2; exit}")
    "$0" -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank "$NODE_RANK" \
        --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" tests/rdma/device/mp_check.py --arxg
    code=$?
    ARXTUNE_PYTHON=$0 bash scripts/rdma_lab/doctor-cases.sh "$1" || code=1
    exit $code' "$PY" "$DOCTOR_OUT" || rc=1
"$PY" tests/rdma/device/doctor_cases_check.py "$DOCTOR_OUT" || rc=1

world3() {
    local out=.cache/rdma-world3 t0=$SECONDS
    echo "test-rdma: [3/3] three guests: world 3 on a ring (rxe0, rxe1) and a switch (rxe2, rxe3)"
    rm -rf "$out"
    bash "$LAB" run3 --mem 3072 --timeout 1200 -- bash -c '
        export GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v ip="$ARXTUNE_LAB_NODE_IP" "index(\$4, ip \"/\") == 1 {print \$2; exit}")
        # one rank per guest, with the variables torchrun sets: its agent would import torch again (a minute per guest)
        RANK=$NODE_RANK WORLD_SIZE=3 LOCAL_RANK=0 exec "$0" tests/rdma/device/world3_check.py --out "$1" \
            --unreachable rxe0 --topology ring=rxe0,rxe1 --topology switch=rxe2,rxe3' "$PY" "$out" || return 1
    "$PY" -m arxtune show "$out/world3-ring" || return 1
    echo "test-rdma: three guests took $((SECONDS - t0)) s"
}
world3 || rc=1

if ((rc == 0)); then echo "test-rdma: PASS"; else echo "test-rdma: FAIL" >&2; fi
exit $rc
