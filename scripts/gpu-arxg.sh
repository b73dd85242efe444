#!/usr/bin/env bash
# arxg's evidence on a lent GPU in one call: what the device says about host memory and which kernel
# build loads, the GPU tier, the two-rank benchmark in every view, the host's share of an eager call,
# the proxy's wait policy, and a world-1 sweep of arxg beside nccl. Files under OUT_DIR, nothing deeper:
#   device.txt        GPU, driver, torch/Triton, HMM state, CUDA memory attributes, arxtune doctor
#   test-gpu.log      make test-gpu (skip reasons shown: the direct memory mode where the device refuses it)
#   arx_graph.txt/.csv/.png   benchmarks/arx_graph.py: graph, eager (in phase, from C and from Python, and
#                     with the peers ahead), isolated (in phase, one thread, after 20 ms idle), decode 50/200 us
#   eager_host.txt    benchmarks/arxg_eager_host.py --gpu: the host's share of an eager call, by path
#   proxy_wait.txt    benchmarks/arxg_proxy_wait.py --gpu: CPU of an idle proxy and calls after GPU work, per policy
#   sweep.log, sweep.tar.gz   arxtune sweep at world 1: arxg and nccl, all_reduce bf16, 4-64 KiB, four views
#   scripts/gpu-arxg.sh OUT_DIR [SIZES]        (about 5 minutes on an H100; SIZES: bytes, comma-separated)
set -uo pipefail
out=${1:?usage: scripts/gpu-arxg.sh OUT_DIR [SIZES]}
sizes=${2:-1024,4096,16384,65536}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${GPU_PYTHON:-python3}
status=0
step() { echo "== $* ($(date -u +%H:%M:%S))"; }

{
  step device
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  nvidia-smi -q | grep -iE "addressing mode|hmm" || echo "nvidia-smi -q names no addressing mode"
  echo "nvidia_uvm uvm_disable_hmm: $(cat /sys/module/nvidia_uvm/parameters/uvm_disable_hmm 2>/dev/null || echo 'not readable')"
  uname -rm
  nproc
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  $PY - <<'PY'
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph.memory import choose, read_attributes
attrs = read_attributes(0)
print("cuda attributes:", attrs.describe())
for mode in ("auto", "registered", "direct"):
    try:
        print(f"memory {mode}: {choose(attrs, mode)}")
    except RdmaUnavailable as exc:
        print(f"memory {mode}: refused: {exc}")
PY
  step doctor
  $PY -m arxtune doctor
} > "$out/device.txt" 2>&1 || status=1
cat "$out/device.txt"

step benchmark
timeout 240 $PY benchmarks/arx_graph.py --memory all --samples 100 --sizes "$sizes" --idle-ms 20 --out "$out/arx_graph.csv" \
  --plot "$out/arx_graph.png" > "$out/arx_graph.txt" 2>&1 || status=1
cat "$out/arx_graph.txt"

step "sweep at world 1"
tmp=$(mktemp -d)
timeout 240 $PY -m arxtune sweep -c configs/sweep/h200.toml --backends arxg,nccl --ops all_reduce --dtypes bfloat16 \
  --views eager,isolated,graph,decode --min-bytes 4KiB --max-bytes 64KiB --step-factor 4 --nproc-per-node 1 \
  --out "$tmp" --no-progress > "$out/sweep.log" 2>&1 || status=1
tail -n 40 "$out/sweep.log"
tar -czf "$out/sweep.tar.gz" -C "$tmp" . && rm -rf "$tmp"
step "gpu tier"
ARXTUNE_REQUIRE_GPU=1 PYTEST_ADDOPTS=-rs timeout 240 make test-gpu GPU_PYTHON="$PY" > "$out/test-gpu.log" 2>&1 || status=1
tail -n 30 "$out/test-gpu.log"

step "host share of an eager call"
timeout 120 $PY benchmarks/arxg_eager_host.py --gpu > "$out/eager_host.txt" 2>&1 || status=1
cat "$out/eager_host.txt"

step "the proxy's wait policy"
timeout 180 $PY benchmarks/arxg_proxy_wait.py --gpu --busy-us 50 200 2000 --samples 50 > "$out/proxy_wait.txt" 2>&1 || status=1
cat "$out/proxy_wait.txt"

step "done, status $status"
exit $status
