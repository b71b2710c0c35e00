#!/usr/bin/env bash
# A soak of real clients against a fresh `gpufuse serve` (tests/real-clients/soak.py):
# concurrent sessions of libcudart, CuPy and cuda-python programs, the node's RSS, workers,
# sessions and ledger bytes sampled over time; exit status 1 on any client error, memory growth
# or anything left behind.
#   scripts/soak.sh [--sessions 64] [--minutes 10] [--interval 10] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-test-deps.sh
# shellcheck disable=SC1091
. .deps/env.sh
pkgs=(-p gpufuse-cli -p gpufuse-shim)
[ -d crates/nvml-shim ] && pkgs+=(-p gpufuse-nvml-shim)
[ -d crates/nvrtc-shim ] && pkgs+=(-p gpufuse-nvrtc-shim)
cargo build --release "${pkgs[@]}"
exec "$GPUFUSE_PY" tests/real-clients/soak.py "$@"
