#!/usr/bin/env bash
# The RDMA tier (make test-rdma): real soft-RoCE devices in QEMU guests.
#   1. lab.sh setup (idempotent: packages, guest kernel, initramfs)
#   2. ONE guest boot: pytest tests/rdma (pure tests, transport, 2- and 3-rank
#      torchrun checks, arxtune sweep with arx/arx2, ib_write_lat floor, doctor)
#   3. ONE two-guest boot: torchrun --nnodes 2 across two kernels (mp_check.py --arxg)
#   4. ONE three-guest boot: three ranks on a ring and on a switch (world3_check.py:
#      reachability, an arx sweep and the communicator per topology; `arxtune show` prints the ring's run)
# Fails if anything fails or any RDMA test is skipped (ARXTUNE_REQUIRE_RDMA=1).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LAB=scripts/rdma_lab/lab.sh
PY=${ARXTUNE_PYTHON:-.venv/bin/python}
JUNIT=.cache/rdma-tier-junit.xml

bash "$LAB" setup || { echo "test-rdma: lab setup failed" >&2; exit 1; }
# Debian's pyverbs (built for CPython 3.11) on the path, without touching the venv.
mkdir -p .cache/pyverbs-path && ln -sfn /usr/lib/python3/dist-packages/pyverbs .cache/pyverbs-path/pyverbs
export PYTHONPATH=$PWD/.cache/pyverbs-path${PYTHONPATH:+:$PYTHONPATH}
export ARXTUNE_REQUIRE_RDMA=1
rm -f "$JUNIT"

rc=0
echo "test-rdma: [1/2] one guest: pytest tests/rdma"
bash "$LAB" run -- bash -c 'exec "$0" -m pytest -q -rfEs --durations=8 -p no:cacheprovider tests/rdma --junitxml="$1"' \
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

echo "test-rdma: [2/2] two guests: torchrun --nnodes 2 (arx, arx2 and arxg's verbs proxies across two kernels, two rails)"
# gloo must bind the NIC that carries this node's address, not whatever the hostname resolves to.
bash "$LAB" run2 -- bash -c '
    export GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v ip="$ARXTUNE_LAB_NODE_IP" "index(\$4, ip \"/\") == 1 {print \$2; exit}")
    exec "$0" -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank "$NODE_RANK" \
        --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" tests/rdma/mp_check.py --arxg' "$PY" || rc=1

world3() {
    local out=.cache/rdma-world3 t0=$SECONDS
    echo "test-rdma: three guests: world 3 on a ring (rxe0, rxe1) and a switch (rxe2, rxe3)"
    rm -rf "$out"
    bash "$LAB" run3 --mem 3072 --timeout 1200 -- bash -c '
        export GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v ip="$ARXTUNE_LAB_NODE_IP" "index(\$4, ip \"/\") == 1 {print \$2; exit}")
        # one rank per guest, with the variables torchrun sets: its agent would import torch again (a minute per guest)
        RANK=$NODE_RANK WORLD_SIZE=3 LOCAL_RANK=0 exec "$0" tests/rdma/world3_check.py --out "$1" \
            --unreachable rxe0 --topology ring=rxe0,rxe1 --topology switch=rxe2,rxe3' "$PY" "$out" || return 1
    "$PY" -m arxtune show "$out/world3-ring" || return 1
    echo "test-rdma: three guests took $((SECONDS - t0)) s"
}
world3 || rc=1

if ((rc == 0)); then echo "test-rdma: PASS"; else echo "test-rdma: FAIL" >&2; fi
exit $rc
