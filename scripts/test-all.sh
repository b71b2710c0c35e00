#!/usr/bin/env bash
# Runs every test tier that works without a GPU:
#   unit + component (cargo test), then the real-client suites (NVIDIA's libraries from PyPI
#   through the shim against a real `gpufuse serve` on the emulated GPU).
# Installs what it needs first (idempotent): PyPI wheels into .deps/, see scripts/setup-test-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== build (release) =="
cargo build --release --workspace

echo "== unit and component tests =="
cargo test --release --workspace

echo "== real-client suites =="
bash scripts/run-real-clients.sh
