#!/usr/bin/env bash
# The conformance lane: on a machine with an NVIDIA GPU, build the conformance probe
# (tests/conformance/probe.c) with the machine's gcc against its cuda.h, run it and probe.py
# natively and through gpufuse (`serve --devices cuda`) on the same GPU, and diff the outputs
# (scripts/conformance-diff.py, docs/conformance.md). Under 60 s on an H200.
#   GPUFUSE_BIN=DIR  where gpufuse, libcuda.so and libnvidia_ml.so are (default target/release);
#                    without a gpufuse binary there, only the native runs are made
#   OUT=DIR          where the outputs go (default ./gpu-lane-out/conformance, ignored by git):
#                    conformance-native.txt, conformance-gpufuse.txt, conformance-py-native.txt,
#                    conformance-py-gpufuse.txt, conformance-diff.txt, conformance-py-diff.txt
# Exit status 1 if a step failed or the probe's output differs beyond the intended differences.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-lane-out/conformance}
bin=${GPUFUSE_BIN:-$root/target/release}
py=${GPUFUSE_LANE_PY:-python3}
mkdir -p "$out"
status=0
say() { echo "conformance: $*"; }

# cuda.h: next to nvcc (…/bin/nvcc -> …/include), else the usual places.
inc=${CUDA_INCLUDE:-}
if [ -z "$inc" ]; then
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
  for d in ${nvcc:+"$(dirname "$(readlink -f "$nvcc")")/../include"} /usr/local/cuda/include \
           /usr/include; do
    [ -f "$d/cuda.h" ] && { inc=$(readlink -f "$d"); break; }
  done
fi
[ -n "$inc" ] || { say "no cuda.h found (set CUDA_INCLUDE)"; exit 1; }
work=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
  rm -rf "$work"
}
trap cleanup EXIT

cc=${CC:-gcc}
if ! timeout 30 "$cc" -O1 -Wall -I"$inc" -o "$work/probe" tests/conformance/probe.c -ldl \
    >"$out/probe-build.log" 2>&1; then
  say "building the probe failed:"; tail -20 "$out/probe-build.log"; exit 1
fi
say "probe built against $inc/cuda.h ($(grep -m1 '#define CUDA_VERSION' "$inc/cuda.h" | awk '{print $3}'))"

# run LABEL LIMIT_S CMD...: stdout to $out/LABEL.txt, stderr to $out/LABEL.err
run() {
  local label=$1 limit=$2 rc t0 t1; shift 2
  t0=$EPOCHREALTIME
  timeout -k 5 "$limit" "$@" >"$out/$label.txt" 2>"$out/$label.err"
  rc=$?
  t1=$EPOCHREALTIME
  say "$(printf '%-28s rc=%-3d wall=%5.1fs lines=%d' "$label" "$rc" \
    "$(awk "BEGIN{print $t1 - $t0}")" "$(wc -l <"$out/$label.txt")")"
  grep -E "= (signal|timeout|exit)" "$out/$label.txt" | sed 's/^/    crashed: /'
  [ $rc -eq 0 ] || status=1
  return 0
}

run conformance-native 25 "$work/probe"
run conformance-py-native 25 "$py" tests/conformance/probe.py

if [ -x "$bin/gpufuse" ]; then
  sock="$work/conf.sock"
  GPUFUSE_LOG=${GPUFUSE_LOG:-info} "$bin/gpufuse" serve --listen "unix:$sock" \
    --devices "${GPUFUSE_CONFORMANCE_DEVICES:-cuda}" >"$out/conformance-server.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  timeout 10 "$bin/gpufuse" status --server "unix:$sock" >"$out/conformance-status.txt" 2>&1 \
    || say "gpufuse status failed: $(tail -2 "$out/conformance-status.txt")"
  run conformance-gpufuse 30 "$bin/gpufuse" run --server "unix:$sock" -- "$work/probe"
  run conformance-py-gpufuse 40 "$bin/gpufuse" run --server "unix:$sock" -- "$py" tests/conformance/probe.py
  for pair in "conformance-native conformance-gpufuse conformance-diff" \
              "conformance-py-native conformance-py-gpufuse conformance-py-diff"; do
    set -- $pair
    python3 scripts/conformance-diff.py "$out/$1.txt" "$out/$2.txt" >"$out/$3.txt" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    say "$3: $(tail -1 "$out/$3.txt")"
    grep '^DIFF:' "$out/$3.txt" | head -60 | sed 's/^/    /'
  done
  say "server log: $(grep -ciE 'panic|error' "$out/conformance-server.log") lines with panic/error"
else
  say "no $bin/gpufuse: native runs only"
fi
exit $status
