#!/usr/bin/env bash
# The GPU lane: on a machine with an NVIDIA GPU, CUDA, nvcc and PyTorch (and no package
# registry), run the real-client suites natively and through gpufuse on the same GPU, then
# PyTorch through gpufuse, comparing results and timings with the native run.
# Bring along: target/release (gpufuse, libcuda.so) and .deps/ (the wheels), e.g. as the
# device tool's `carry`. Results go to $OUT (or ./gpu-lane-out) and are summarized on stdout
# for docs/gpu-validation.md.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-lane-out}
mkdir -p "$out"
gpufuse=$root/target/release/gpufuse
status=0

echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)" | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$out/summary.txt"
python3 -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/summary.txt"

work=$(mktemp -d)
"$gpufuse" serve --listen "unix:$work/s.sock" --listen tcp:127.0.0.1:7391 --devices cuda 2>"$out/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
"$gpufuse" status --server "unix:$work/s.sock" | tee -a "$out/summary.txt"

run_torch() { # $1 = label, rest = command prefix
  local label=$1; shift
  local t0=$(date +%s.%N)
  "$@" python3 tests/gpu-lane/torch_checks.py "$out/torch-$label.json" ${COMPARE:+--compare "$out/torch-native.json"} \
    >"$out/torch-$label.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  printf 'torch %-8s rc=%d wall=%.1fs\n' "$label" "$rc" "$(echo "$t1 - $t0" | bc)" | tee -a "$out/summary.txt"
  tail -12 "$out/torch-$label.log" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
}

echo "== PyTorch natively ==" | tee -a "$out/summary.txt"
run_torch native env
for transport in unix tcp; do
  addr="unix:$work/s.sock"; [ $transport = tcp ] && addr=tcp:127.0.0.1:7391
  echo "== PyTorch through gpufuse ($transport) ==" | tee -a "$out/summary.txt"
  COMPARE=1 run_torch "gpufuse-$transport" "$gpufuse" run --server "$addr" --
done

if [ -f scripts/run-real-clients.sh ]; then
  for mode in native gpufuse; do
    echo "== real-client suites on the GPU: $mode ==" | tee -a "$out/summary.txt"
    native=0; [ $mode = native ] && native=1
    t0=$(date +%s.%N)
    GPUFUSE_NATIVE=$native GPUFUSE_DEVICES=cuda bash scripts/run-real-clients.sh -q -p no:cacheprovider \
      >"$out/real-clients-$mode.log" 2>&1
    rc=$?; t1=$(date +%s.%N)
    printf 'real clients %-8s rc=%d wall=%.1fs\n' "$mode" "$rc" "$(echo "$t1 - $t0" | bc)" | tee -a "$out/summary.txt"
    tail -5 "$out/real-clients-$mode.log" | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || status=1
  done
fi
exit $status
