#!/usr/bin/env bash
# abort_loop.sh PYTHON PYTHONPATH N LABEL SCRIPT ARGS... : N torchrun jobs of 2 ranks; prints rc and abort counts
PY=$1; PP=$2; N=$3; LABEL=$4; shift 4
dir=${LOOPS:-/tmp/arxtune-loops}/$LABEL; mkdir -p $dir
aborts=0; bad=0
for i in $(seq 1 $N); do
  PYTHONPATH=$PP OMP_NUM_THREADS=1 ARXTUNE_BOOT_OUT=${LOOPS:-/tmp/arxtune-loops}/boot timeout 300 $PY -m torch.distributed.run --standalone --nproc-per-node 2 "$@" > $dir/$i.log 2>&1
  rc=$?
  a=$(grep -c 'terminate called' $dir/$i.log)
  [ $a -gt 0 ] && aborts=$((aborts+1))
  [ $rc -ne 0 ] && bad=$((bad+1))
done
echo "$LABEL: $N runs, rc!=0 in $bad, abort in $aborts"
