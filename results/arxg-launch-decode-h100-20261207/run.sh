#!/usr/bin/env bash
# Before and after on one machine in one call (the device tool runs this from the repository root of a copy
# that carries .dev/before = main at 7f54179 and .dev/after = this branch; OUT is where files come back).
# The before tree gets the after tree's two-rank benchmark and the busy-kernel module it imports (arxg at
# 7f54179 uses neither), so both are measured by the same script; its sweep and everything else is its own.
set -uo pipefail
root=$PWD/.dev
w=/tmp/w
mkdir -p "$w/before" "$w/after"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
save() { tar -czf "$OUT/w.tgz.part" -C "$w" . && mv "$OUT/w.tgz.part" "$OUT/w.tgz"; }
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
cp "$root/after/benchmarks/arx_graph.py" "$root/before/benchmarks/arx_graph.py"
cp "$root/after/arxtune/runtime/cudadrv.py" "$root/after/arxtune/runtime/cuda_launch.c" "$root/before/arxtune/runtime/"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; nproc
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

step "before: two ranks"
(cd "$root/before" && PYTHONPATH=$PWD timeout 100 python3 benchmarks/arx_graph.py --memory registered --samples 100 \
  --sizes 1024,16384,65536 --idle-ms 20 --views graph,eager,eager-ahead,isolated,isolated-one-thread,decode \
  --out "$w/before/arx_graph.csv" > "$w/before/arx_graph.txt" 2>&1); tail -n 25 "$w/before/arx_graph.txt"; save
step "before: world 1"
(cd "$root/before" && PYTHONPATH=$PWD timeout 90 python3 -m arxtune sweep -c configs/sweep/h200.toml --backends arxg,nccl \
  --ops all_reduce --dtypes bfloat16 --views eager,isolated,graph --min-bytes 4KiB --max-bytes 64KiB --step-factor 4 \
  --nproc-per-node 1 --out "$w/before/runs" --no-progress > "$w/before/sweep.log" 2>&1); tail -n 5 "$w/before/sweep.log"
(cd "$root/before" && PYTHONPATH=$PWD python3 -m arxtune show "$w"/before/runs/* 2>&1 | head -60 > "$w/before/show.txt"); save
step "before: host share of an eager call"
(cd "$root/before" && PYTHONPATH=$PWD timeout 60 python3 benchmarks/arxg_eager_host.py --gpu > "$w/before/eager_host.txt" 2>&1)
cat "$w/before/eager_host.txt"; save

step "after: scripts/gpu-arxg.sh"
(cd "$root/after" && timeout 390 bash scripts/gpu-arxg.sh "$w/after" 1024,16384,65536)
(cd "$root/after" && tar -xzf "$w/after/sweep.tar.gz" -C "$w/after" && PYTHONPATH=$PWD python3 -m arxtune show "$w"/after/2* \
  2>&1 | head -80 > "$w/after/show.txt")
save
step done
