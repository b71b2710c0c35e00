#!/usr/bin/env bash
# Regenerates crates/cuda-types/src/generated into a temp dir and fails if it differs from the
# checked-in files, then compiles struct_layout.c against each header: the generated structs'
# size, alignment and member offsets are the header's (the C compiler's own layout).
# Usage: check_cuda_types.sh INCLUDE_12 INCLUDE_13
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/gen_cuda_types.py "$1" "$2" "$tmp" >/dev/null
# The checked-in files are formatted with the workspace (cargo fmt); format the fresh ones alike.
rustfmt --edition "$(sed -n 's/^edition = "\([0-9]*\)"/\1/p' Cargo.toml | head -n1)" "$tmp"/*.rs
diff -ru crates/cuda-types/src/generated "$tmp"
echo "cuda-types: generated files are current"
for inc in "$1" "$2"; do
    cc -std=c11 -fsyntax-only -I "$inc" crates/cuda-types/src/generated/struct_layout.c
    echo "cuda-types: struct layouts match $inc/cuda.h"
done
