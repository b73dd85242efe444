#!/usr/bin/env bash
# The GPU evidence in one go on a CUDA machine: the GPU test tier, a sweep
# (with thresholds and plot), arxg's graph benchmark with its handshake floor,
# the arx staging breakdown and the dispatch cost.
#   scripts/gpu-evidence.sh OUT_DIR
set -uo pipefail
out=${1:?usage: scripts/gpu-evidence.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
make test-gpu GPU_PYTHON=python3 2>&1 | tee "$out/test-gpu.log" || status=1
python3 -m arxtune sweep -c configs/sweep/h200.toml --out "$out/results" --no-progress || status=1
python3 benchmarks/arx_graph.py --samples 100 --out "$out/arx_graph.csv" --plot "$out/arx_graph.png" || status=1
python3 benchmarks/arx_staging.py --out "$out/arx_staging.csv" || status=1
python3 benchmarks/dispatch_overhead.py 2>&1 | tee "$out/dispatch.txt" || status=1
exit $status
