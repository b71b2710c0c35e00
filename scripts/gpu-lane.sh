#!/usr/bin/env bash
# The GPU lane: on a machine with an NVIDIA GPU, its driver, nvcc, PyTorch and CuPy (no package
# registry needed), run each check natively and through gpufuse (`serve --devices cuda`) on the
# same GPU, and compare results and timings. Every step has a time limit; a failed step is
# reported and the lane goes on.
#   GPUFUSE_BIN=DIR  where gpufuse, gpufuse-bench, libcuda.so and libnvidia_ml.so are
#                    (default target/release)
#   OUT=DIR          where logs and summary.txt go (default ./gpu-lane-out)
#   GPUFUSE_LANE_STEPS=REGEX  run only the steps whose label matches (e.g. 'torch|conformance'),
#                    to split the lane over several calls of a device's 10-minute limit
# Summary on stdout, for docs/gpu-validation.md. Exit status 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-lane-out}
bin=${GPUFUSE_BIN:-$root/target/release}
mkdir -p "$out"
gpufuse=$bin/gpufuse
py=${GPUFUSE_LANE_PY:-python3}
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
export PYTHONUNBUFFERED=1
status=0
say() { echo "$*" | tee -a "$out/summary.txt"; }

say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$out/summary.txt"
say "nvcc: $("$nvcc" --version | tail -2 | head -1)"
"$py" -c 'import torch, cupy; print("torch:", torch.__version__, "cuda", torch.version.cuda, "| cupy:", cupy.__version__)' 2>&1 | tee -a "$out/summary.txt"

# step LABEL LIMIT_S CMD...: runs CMD with a time limit, log in $out/LABEL.log.
step() {
  local label=$1 limit=$2; shift 2
  if [ -n "${GPUFUSE_LANE_STEPS:-}" ] && ! [[ $label =~ $GPUFUSE_LANE_STEPS ]]; then
    return 0
  fi
  local t0 t1 rc
  t0=$EPOCHREALTIME
  timeout -k 5 "$limit" "$@" >"$out/$label.log" 2>&1
  rc=$?
  t1=$EPOCHREALTIME
  say "$(printf '%-26s rc=%-3d wall=%6.1fs' "$label" "$rc" "$(python3 -c "print($t1 - $t0)")")"
  grep -E "FAILED|FAIL |PASS|passed|failed|ratio| us |GB/s| ms |device:|mem_get_info|launches|pipeline|bandwidth|OutOfMemory|->|sees|slot 7|Error|error" "$out/$label.log" | head -25 | sed 's/^/    /' | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -5 "$out/$label.log" | sed 's/^/    | /' | tee -a "$out/summary.txt"; }
  return $rc
}

work=$(mktemp -d)
"$nvcc" -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -o "$work/smoke" tests/gpu-lane/smoke.cu 2>"$out/nvcc.log" || say "nvcc failed: $(tail -3 "$out/nvcc.log")"
"$nvcc" -O2 -gencode arch=compute_90,code=compute_90 -o "$work/smoke-ptx" tests/gpu-lane/smoke.cu 2>>"$out/nvcc.log"

GPUFUSE_LOG=${GPUFUSE_LOG:-info} "$gpufuse" serve --listen "unix:$work/s.sock" --listen tcp:127.0.0.1:7391 \
  --devices "${GPUFUSE_LANE_DEVICES:-cuda}" 2>"$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
timeout 20 "$gpufuse" status --server "unix:$work/s.sock" 2>&1 | tee -a "$out/summary.txt"
U="unix:$work/s.sock"
T=tcp:127.0.0.1:7391

say "== the data path, gpufuse / native (gpufuse-bench gpu: pipelines, tiny launches, op + sync, copies, graphs) =="
step bench-gpu 240 "$bin/gpufuse-bench" gpu

say "== CUDA C++ (nvcc, static libcudart) =="
step smoke-native 30 "$work/smoke"
step smoke-gpufuse-unix 60 "$gpufuse" run --server "$U" -- "$work/smoke"
step smoke-gpufuse-tcp 60 "$gpufuse" run --server "$T" -- "$work/smoke"
step smoke-ptx-jit-gpufuse 60 "$gpufuse" run --server "$U" -- "$work/smoke-ptx"

say "== with no host arena (GPUFUSE_PINNED_ARENA=0): pinned memory travels as bytes =="
step smoke-gpufuse-no-arena 60 env GPUFUSE_PINNED_ARENA=0 "$gpufuse" run --server "$U" -- "$work/smoke"
step cupy-gpufuse-no-arena 90 env GPUFUSE_PINNED_ARENA=0 "$gpufuse" run --server "$U" -- "$py" tests/gpu-lane/cupy_checks.py

say "== listing a module's functions (cuFFT's export table 6e163fbe slot 7) =="
step module-listing-native 60 "$py" tests/real-clients/python/module_listing.py
step module-listing-gpufuse 60 "$gpufuse" run --server "$U" -- "$py" tests/real-clients/python/module_listing.py

say "== CuPy and cuda-python =="
step cupy-native 60 "$py" tests/gpu-lane/cupy_checks.py
step cupy-gpufuse 90 "$gpufuse" run --server "$U" -- "$py" tests/gpu-lane/cupy_checks.py

say "== PyTorch =="
step torch-native 90 "$py" tests/gpu-lane/torch_checks.py "$out/torch-native.json"
step torch-gpufuse 150 "$gpufuse" run --server "$U" -- "$py" tests/gpu-lane/torch_checks.py "$out/torch-gpufuse.json" --compare "$out/torch-native.json"
grep -E "ratio" "$out/torch-gpufuse.log" 2>/dev/null | sed 's/^/    /' | tee -a "$out/summary.txt"
step slice-4GiB 60 "$gpufuse" run --server "$U" --vram 4GiB -- "$py" tests/gpu-lane/slice_checks.py

say "== what users run: bf16/fp16 autocast training (GPT-style, ResNet AMP), bf16 inference, SDPA, torch.compile, cuDNN, CUDA graphs =="
step torch-mixed-native 300 "$py" tests/gpu-lane/torch_mixed.py "$out/torch-mixed-native.json"
step torch-mixed-gpufuse 400 "$gpufuse" run --server "$U" -- "$py" tests/gpu-lane/torch_mixed.py "$out/torch-mixed-gpufuse.json" --compare "$out/torch-mixed-native.json"
grep -E "ratio" "$out/torch-mixed-gpufuse.log" 2>/dev/null | sed 's/^/    /' | tee -a "$out/summary.txt"

say "== NVIDIA's libraries through PyTorch: every precision of cuBLASLt, cuDNN, SDPA, NCCL, cuFFT, compile (the emulated tier's program) =="
step torch-libraries-native 300 "$py" tests/real-clients/python/torch_libraries.py all --strict
step torch-libraries-gpufuse 400 "$gpufuse" run --server "$U" -- "$py" tests/real-clients/python/torch_libraries.py all --strict

say "== conformance probe: natively and through gpufuse, diffed (docs/conformance.md) =="
step conformance 180 env GPUFUSE_BIN="$bin" OUT="$out/conformance" \
  GPUFUSE_CONFORMANCE_DEVICES="${GPUFUSE_LANE_DEVICES:-cuda}" bash scripts/conformance-lane.sh

say "== compute shares: two tenants, 2 ms matrix products, 15 s =="
shares() { # $1 label, $2/$3 = run prefixes
  if [ -n "${GPUFUSE_LANE_STEPS:-}" ] && ! [[ shares-$1 =~ $GPUFUSE_LANE_STEPS ]]; then
    return 0
  fi
  local at; at=$(python3 -c 'import time; print(time.time() + 25)')
  $2 "$py" tests/gpu-lane/share_worker.py 15 A "$at" >"$out/share-$1-A.log" 2>&1 &
  local a=$!
  $3 "$py" tests/gpu-lane/share_worker.py 15 B "$at" >"$out/share-$1-B.log" 2>&1
  wait $a
  say "$(printf '%-26s %s | %s' "shares-$1" "$(tail -1 "$out/share-$1-A.log")" "$(tail -1 "$out/share-$1-B.log")")"
}
shares native "" ""
shares gpufuse-30-70 "timeout 90 $gpufuse run --server $U --compute 30 --" "timeout 90 $gpufuse run --server $U --compute 70 --"

timeout 20 "$gpufuse" status --server "$U" 2>&1 | tail -5 | tee -a "$out/summary.txt"
say "server log: $(grep -ciE 'error|panic' "$out/server.log") lines with error/panic"
grep -iE 'panic|error' "$out/server.log" | head -20 | sed 's/^/    /' | tee -a "$out/summary.txt"
exit $status
