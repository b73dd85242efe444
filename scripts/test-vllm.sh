#!/usr/bin/env bash
# `make test-vllm`: build (or reuse) <repo>/.venv-vllm and run the vLLM tier, tests/vllm, in it.
#
# The tier fails, never skips, when vLLM is missing (ARXTUNE_REQUIRE_VLLM=1).
# Extra arguments go to pytest, e.g. scripts/test-vllm.sh -k fallback -x.
#
# `scripts/test-vllm.sh --plugin-in-guest` (make test-vllm-guest) instead runs the routing test
# (tests/vllm/test_plugin_tp.py) inside the soft-RoCE guest with arx as the routed backend: 8 minutes
# more than CI's budget holds, so it runs by hand.
# `scripts/test-vllm.sh --engine-in-guest` (make test-vllm-guest-engine) instead runs vLLM's
# engine test (tests/vllm/test_engine.py, two engines, arx routed for decode sizes) inside the
# guest: the engine's start-up under the software CPU takes far longer than CI allows.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
VENV="$(bash "$ROOT/scripts/venv-vllm.sh" | tail -n 1)"
venv_s=$(( $(date +%s) - start ))
echo "test-vllm: venv $VENV ready after ${venv_s} s"
cd "$ROOT"

in_guest() { # timeout, memory (MB), then the command; arx is the routed backend, pyverbs the venv's (the rdma extra)
    local timeout=$1 mem=$2; shift 2
    bash scripts/rdma_lab/lab.sh setup || return 1
    ARXTUNE_VLLM_TEST_BACKEND=arx ARXTUNE_REQUIRE_VLLM=1 \
        ARXTUNE_VLLM_TEST_TIMEOUT=$(( timeout - 600 )) \
        bash scripts/rdma_lab/lab.sh run --mem "$mem" --timeout "$timeout" -- "$@"
}

if [[ "${1:-}" == --engine-in-guest ]]; then
    code=0
    in_guest 4200 10240 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs --basetemp .cache/guest-engine tests/vllm/test_engine.py \
        -k "same_tokens or both_kinds" || code=1
    echo "test-vllm: engine in the guest $(( $(date +%s) - start - venv_s )) s, exit $code"
    exit $code
fi

if [[ "${1:-}" == --plugin-in-guest ]]; then
    # The two-process vLLM run with arx taking the routed ranges, over real soft-RoCE devices in the lab
    # guest (software CPU: vLLM's start-up takes minutes).
    code=0
    in_guest 2400 4096 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs tests/vllm/test_plugin_tp.py || code=1
    echo "test-vllm: the plugin routed to arx in the guest $(( $(date +%s) - start - venv_s )) s, exit $code"
    exit $code
fi

set +e
echo "test-vllm: tests/vllm, routed backend gloo"
ARXTUNE_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest tests/vllm -p no:cacheprovider -ra "$@"
code=$?
set -e
echo "test-vllm: venv ${venv_s} s, tier $(( $(date +%s) - start - venv_s )) s, exit $code"
exit $code
