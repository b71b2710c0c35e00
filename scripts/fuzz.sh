#!/usr/bin/env bash
# Runs gpufuse's fuzz targets (fuzz/fuzz_targets: frame and message decoders, the PTX parser,
# the fatbin/cubin readers, the worker's request handling) with cargo-fuzz (libFuzzer).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default: 20 s each, every target
#   FUZZ_RUNS=N scripts/fuzz.sh 0 TARGET                  N inputs instead of a time limit
# cargo-fuzz's flags need a nightly compiler; the machine has the stable toolchain only, so
# RUSTC_BOOTSTRAP=1 lets stable rustc take them (the sanitizer is off: -s none; libFuzzer's
# coverage instrumentation is what finds inputs). Installs cargo-fuzz if missing (idempotent).
# Corpora live in fuzz/corpus/TARGET (git-ignored); a crash is saved in fuzz/artifacts/TARGET
# and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-20}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame ptx_parse fatbin worker_requests)

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz (once, about 2 minutes)"
  cargo install --locked cargo-fuzz
fi

export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  if [ -n "${FUZZ_RUNS:-}" ]; then
    limit=(-runs="$FUZZ_RUNS")
  else
    limit=(-max_total_time="$secs")
  fi
  if [ -n "${FUZZ_RUNS:-}" ]; then what="$FUZZ_RUNS inputs"; else what="$secs s"; fi
  echo "== fuzz $t ($what) =="
  log="fuzz/last-$t.log"
  set +e
  cargo fuzz run --sanitizer none --release "$t" "fuzz/corpus/$t" -- \
    -timeout=10 -rss_limit_mb=4096 -max_len=65536 "${limit[@]}" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^(#[0-9]+\s+DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -40 "$log" >&2
    echo "fuzz: $t failed (exit $rc); failing inputs, if any, are in fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
