#!/usr/bin/env bash
# `make test-vllm`: build (or reuse) <repo>/.venv-vllm and run the vLLM tier, tests/vllm, in it.
#
# The tier fails, never skips, when vLLM is missing (ARXTUNE_REQUIRE_VLLM=1).
# Extra arguments go to pytest, e.g. scripts/test-vllm.sh -k fallback -x.
# ARXTUNE_VLLM_TEST_BACKEND=arx runs the routing test against arx instead of gloo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
VENV="$(bash "$ROOT/scripts/venv-vllm.sh" | tail -n 1)"
venv_s=$(( $(date +%s) - start ))
echo "test-vllm: venv $VENV ready after ${venv_s} s"

cd "$ROOT"
set +e
ARXTUNE_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest tests/vllm -p no:cacheprovider -ra "$@"
code=$?
set -e
echo "test-vllm: venv ${venv_s} s, tier $(( $(date +%s) - start - venv_s )) s, exit $code"
exit $code
