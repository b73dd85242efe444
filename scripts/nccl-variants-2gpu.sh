#!/usr/bin/env bash
# NCCL variants on two GPUs of one host, then arxtune's NCCL tuner plugin loaded by NCCL itself.
#
# THIS SCRIPT HAS NOT RUN. It was written while machines with two or more GPUs were withheld; the
# pieces under it ran on CPUs (the plugin driven through ctypes, the export round trip, variants in a
# two-rank gloo sweep) and the one-GPU plumbing is tests/gpu/test_nccl_variants_gpu.py. Expect to
# fix small things on its first run, and keep what it prints.
#
# What it does:
#   1. sweeps NCCL's own choice beside its protocol / algorithm / channel variants (eager and graph),
#   2. calibrates with nccl as the baseline and exports the NCCL part for the tuner plugin,
#   3. runs nccl-tests' all_reduce_perf without and with the plugin (NCCL_DEBUG=INFO, subsystem
#      TUNING, shows each choice the plugin makes), if NCCL_TESTS names a built nccl-tests/build,
#   4. sweeps plain nccl again with the plugin loaded, and prints per size: NCCL's own choice,
#      the best variant, and NCCL with the plugin (which should be near the best variant).
#
# Usage (repository root, a Python with CUDA torch, two or more GPUs):
#   NCCL_TESTS=/path/to/nccl-tests/build bash scripts/nccl-variants-2gpu.sh [OUT_DIR]
set -euo pipefail

OUT=${1:-results/nccl-variants-2gpu}
PY=${PYTHON:-python3}
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast stays off here
GRID=(--min-bytes 1KiB --max-bytes 64MiB --step-factor 2)
mkdir -p "$OUT"

cat >"$OUT/variants.toml" <<'EOF'
[sweep]
backends = ["nccl"]
ops = ["all_reduce", "all_gather"]
dtypes = ["bfloat16"]
modes = ["eager", "graph"]

[sweep.backend_options.nccl]
variants = ["proto=LL", "proto=LL128", "proto=Simple", "algo=Ring", "algo=Tree", "proto=LL,channels=4", "proto=Simple,channels=4"]
EOF

echo "== 0. NCCL itself takes each variant's protocol, algorithm and channel count (two ranks)"
"$PY" -m pytest -q -s -rs tests/gpu/test_nccl_variants_gpu.py -k two_ranks 2>&1 | tee "$OUT/variants-reach-nccl.log" \
  || echo "FAILED: variants did not reach NCCL as expected; the timings below are then NCCL's own choice"

echo "== 1. sweep: NCCL's own choice and its variants, two ranks"
"$PY" -m arxtune sweep -c "$OUT/variants.toml" "${GRID[@]}" --nproc-per-node 2 --out "$OUT" --run-id variants --no-progress

echo "== 2. calibrate among the variants and export the plugin's file"
"$PY" -m arxtune calibrate "$OUT/variants" --baseline nccl --export nccl-tuner --tuner-out "$OUT/nccl-tuner.csv"
"$PY" -m arxtune show "$OUT/variants/thresholds.json"
PLUGIN=$("$PY" -m arxtune nccl-tuner build)
cat "$OUT/nccl-tuner.csv"

if [[ -x "${NCCL_TESTS:-}/all_reduce_perf" ]]; then
  echo "== 3. nccl-tests all_reduce_perf, without and with the plugin"
  "$NCCL_TESTS/all_reduce_perf" -b 1K -e 64M -f 2 -g 2 -d bfloat16 -n 200 | tee "$OUT/nccl-tests-own.txt"
  NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$OUT/nccl-tuner.csv" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    "$NCCL_TESTS/all_reduce_perf" -b 1K -e 64M -f 2 -g 2 -d bfloat16 -n 200 >"$OUT/nccl-tests-plugin.txt" 2>&1
  grep -E "TUNER/Plugin|arxtune tuner" "$OUT/nccl-tests-plugin.txt" | sort | uniq -c | head -40
  grep -vE "NCCL INFO" "$OUT/nccl-tests-plugin.txt"
else
  echo "== 3. skipped: set NCCL_TESTS to a built nccl-tests/build to time nccl-tests with the plugin"
fi

echo "== 4. sweep plain nccl again with the plugin loaded"
NCCL_TUNER_PLUGIN="$PLUGIN" NCCL_TUNER_CONFIG_FILE="$OUT/nccl-tuner.csv" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
  NCCL_DEBUG_FILE="$OUT/nccl-debug.%h.%p.txt" \
  "$PY" -m arxtune sweep --backends nccl --ops all_reduce,all_gather --dtypes bfloat16 --modes eager,graph "${GRID[@]}" \
  --nproc-per-node 2 --out "$OUT" --run-id with-plugin --no-progress
grep -h "arxtune tuner" "$OUT"/nccl-debug.*.txt | sed -E 's/^.*arxtune tuner: //' | sort | uniq -c | sort -rn | head -40

"$PY" - "$OUT" <<'EOF'
import sys
from arxtune.harness.results import load_run

out = sys.argv[1]
variants, plugin = load_run(f"{out}/variants").frame(), load_run(f"{out}/with-plugin").frame()
ok = variants[variants.status == "ok"]
print(f"{'op':<11} {'mode':<6} {'bytes':>10} {'nccl us':>9} {'best variant':<32} {'us':>9} {'with plugin us':>15}")
for (op, mode, size), rows in ok.groupby(["op", "mode", "size"]):
    own = rows[rows.backend == "nccl"].median_us
    best = rows.loc[rows.median_us.idxmin()]
    tuned = plugin[(plugin.op == op) & (plugin["mode"] == mode) & (plugin["size"] == size) & (plugin.status == "ok")].median_us
    print(f"{op:<11} {mode:<6} {size:>10} {own.iloc[0] if len(own) else float('nan'):>9.1f} {best.backend:<32} "
          f"{best.median_us:>9.1f} {tuned.iloc[0] if len(tuned) else float('nan'):>15.1f}")
EOF
