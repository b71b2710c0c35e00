#!/usr/bin/env bash
# Regenerates crates/cuda-types/src/generated into a temp dir and fails if it differs from the
# checked-in files. Usage: check_cuda_types.sh INCLUDE_12 INCLUDE_13
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/gen_cuda_types.py "$1" "$2" "$tmp" >/dev/null
# The checked-in files are formatted with the workspace (cargo fmt); format the fresh ones alike.
rustfmt --edition "$(sed -n 's/^edition = "\([0-9]*\)"/\1/p' Cargo.toml | head -n1)" "$tmp"/*.rs
diff -ru crates/cuda-types/src/generated "$tmp"
echo "cuda-types: generated files are current"
