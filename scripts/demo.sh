#!/usr/bin/env bash
# The main job on one machine: start `gpufuse serve` (real GPUs if a driver and a GPU are
# present, otherwise an emulated GPU), run unmodified CUDA programs through it, say what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

echo "== installing NVIDIA's CUDA runtime, nvcc and CuPy from PyPI into .deps/ (once) =="
bash scripts/setup-test-deps.sh >/dev/null
py=$root/.deps/venv/bin/python
nv=$("$py" -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
export PATH="$nv/cu13/bin:$PATH"

echo "== building gpufuse (release) =="
cargo build --release --workspace --quiet
gpufuse=$root/target/release/gpufuse

work=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
addr="unix:$work/gpufuse.sock"
"$gpufuse" serve --listen "$addr" --devices auto 2>"$work/server.log" &
server=$!
for _ in $(seq 100); do [ -S "$work/gpufuse.sock" ] && break; sleep 0.1; done
echo "== gpufuse serve is up on $addr =="
"$gpufuse" status --server "$addr"

echo
echo "== 1. a CUDA C++ program built by nvcc, run unmodified through gpufuse =="
nvcc -O2 -arch=sm_80 -o "$work/vector_add" examples/vector_add.cu
"$gpufuse" run --server "$addr" -- "$work/vector_add"

echo
echo "== 2. CuPy (static libcudart 12.9) through gpufuse =="
"$gpufuse" run --server "$addr" -- "$py" examples/cupy_demo.py

echo
echo "== server state after the clients exited =="
"$gpufuse" status --server "$addr"
echo "demo: done (server log: first lines below)"
head -5 "$work/server.log"
