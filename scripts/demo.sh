#!/usr/bin/env bash
# The main job on one machine: start `gpufuse serve` (real GPUs if a driver and a GPU are
# present, otherwise an emulated GPU), run unmodified CUDA programs through it, say what happened.
# The first run downloads and builds (several minutes, with pip's and cargo's progress shown);
# later runs do neither and print only the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$SECONDS
step() { echo; echo "== $* =="; }
took() { echo "   ($(( SECONDS - $1 )) s)"; }

t=$SECONDS
if [ -f .deps/stamp ] && [ -x .deps/venv/bin/python ]; then
  step "1/5 test dependencies (NVIDIA's CUDA runtime, nvcc, CuPy from PyPI in .deps/)"
else
  step "1/5 test dependencies: downloading NVIDIA's CUDA runtime, nvcc and CuPy from PyPI into .deps/ (about 1.6 GB, once; a few minutes)"
fi
bash scripts/setup-test-deps.sh --brief --no-torch
took "$t"
py=$root/.deps/venv/bin/python
nv=$("$py" -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
export PATH="$nv/cu13/bin:$PATH"

t=$SECONDS
if [ -x target/release/gpufuse ]; then
  step "2/5 building gpufuse (release; only what changed)"
else
  step "2/5 building gpufuse (release): the first build compiles the workspace and its dependencies, a few minutes on 2 cores"
fi
cargo build --release --workspace
took "$t"
gpufuse=$root/target/release/gpufuse

work=$(mktemp -d)
server=
trap '[ -n "$server" ] && { kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; }; rm -rf "$work"' EXIT
addr="unix:$work/gpufuse.sock"
"$gpufuse" serve --listen "$addr" --devices auto 2>"$work/server.log" &
server=$!
for _ in $(seq 100); do [ -S "$work/gpufuse.sock" ] && break; sleep 0.1; done
step "3/5 gpufuse serve is up on $addr"
"$gpufuse" status --server "$addr"

step "4/5 a CUDA C++ program built by nvcc (examples/vector_add.cu), run unmodified through gpufuse"
nvcc -O2 -arch=sm_80 -o "$work/vector_add" examples/vector_add.cu
"$gpufuse" run --server "$addr" -- "$work/vector_add"
echo "-- the same program asking for a 1 TiB slice: the node refuses it before it starts"
if "$gpufuse" run --server "$addr" --vram 1TiB -- "$work/vector_add"; then
  echo "demo: the 1 TiB session was admitted; expected a refusal" >&2
  exit 1
fi

step "5/5 CuPy as installed (static libcudart 12.9, kernels NVRTC compiles) through gpufuse (examples/cupy_demo.py)"
"$gpufuse" run --server "$addr" -- "$py" examples/cupy_demo.py

echo
echo "== server state after the clients exited =="
"$gpufuse" status --server "$addr"
echo
echo "== the server's log =="
cat "$work/server.log"
echo
echo "demo: done in $(( SECONDS - started )) s"
