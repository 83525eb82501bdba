#!/bin/bash
# Where bertsweep's step time goes: a poor man's profiler. Runs a bert-mini fixed-budget training (random
# sampler, 2 threads) and takes SAMPLES gdb stack samples of the main thread; prints the most frequent
# bertsweep/torch frames. Writes bench/results/stack_sample.txt.
#   bench/stack_sample.sh [SAMPLES=20]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BERTSWEEP:-$ROOT/build/cli/bertsweep}"
N="${1:-20}"
OUT="$ROOT/bench/results/stack_sample.txt"
RAW="$(mktemp)"
cd "$ROOT"
"$BIN" train --config configs/train/bert-mini-brown.yaml --quiet --set data.sampler=random --set threads=2 \
  --set target.mlm_accuracy=0.99 --set target.max_samples=100000 --set target.eval_every_samples=100000000 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$RAW"' EXIT
sleep 8   # past data loading and the first steps
for i in $(seq "$N"); do
  gdb -p "$PID" -batch -ex "thread 1" -ex "bt 40" 2>/dev/null | grep '^#' >>"$RAW" || true
  echo "---" >>"$RAW"
  sleep 0.5
done
kill "$PID" 2>/dev/null || true
{
  echo "# $N gdb samples of bertsweep's main thread (bert-mini, random sampler, batch 64, 2 threads), $(date -u)"
  echo "# innermost recognisable frame per sample (at:: / torch:: / bs:: / BLAS):"
  awk '/^---/{ if (f!="") print f; f=""; next } f=="" && /(at::native|at::|bs::|torch::|sgemm|gemm|dgemm|blas|omp|gomp)/ {
        s=$0; sub(/^#[0-9]+ +(0x[0-9a-f]+ in )?/, "", s); sub(/ \(.*/, "", s); f=s } END{ if (f!="") print f }' "$RAW" |
    sort | uniq -c | sort -rn | head -25
  echo "# bs:: frames on the stack (which part of the step):"
  awk '/^---/{ if (f!="") print f; f=""; next } f=="" && /bs::/ { s=$0; sub(/^#[0-9]+ +(0x[0-9a-f]+ in )?/, "", s);
        sub(/ \(.*/, "", s); f=s } END{ if (f!="") print f }' "$RAW" | sort | uniq -c | sort -rn | head -15
} | tee "$OUT"
