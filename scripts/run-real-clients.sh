#!/usr/bin/env bash
# The real-client tier: NVIDIA's libraries from PyPI (libcudart 12.9 and 13.5, NVRTC, nvcc 13.5,
# CuPy, cuda-python), cudarc and PyTorch's CUDA 13 wheel (test_pytorch.py), unmodified, through
# gpufuse's libcuda.so.1 and libnvidia-ml.so.1 against a real `gpufuse serve` on an emulated GPU.
# No GPU needed.
#   scripts/run-real-clients.sh [PYTEST ARGS...]     e.g. -k cupy, -x, -v
# Installs the test dependencies into .deps/ (idempotent), builds the release binaries when
# they are missing or stale (cargo decides), runs the pytest suite in tests/real-clients/.
# Exit status: pytest's; "no tests collected" (5) is a failure too.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-test-deps.sh
# shellcheck disable=SC1091
. .deps/env.sh
# cuGetErrorString's texts are NVIDIA's: the checked-in table still matches libcudart's.
"$GPUFUSE_PY" scripts/gen_result_texts.py "$GPUFUSE_CUDART13_LIB/libcudart.so.13" --check
# libnvidia-ml.so.1 exports every function of NVIDIA's nvml.h: the generated table still matches.
"$GPUFUSE_PY" scripts/gen_nvml_exports.py "$GPUFUSE_NVIDIA/cu13/include/nvml.h" --check

echo "== building gpufuse (release) =="
pkgs=(-p gpufuse-cli -p gpufuse-shim)
[ -d crates/nvml-shim ] && pkgs+=(-p gpufuse-nvml-shim)
[ -d crates/nvrtc-shim ] && pkgs+=(-p gpufuse-nvrtc-shim)
cargo build --release "${pkgs[@]}"
for f in target/release/gpufuse target/release/libcuda.so; do
  [ -e "$f" ] || { echo "run-real-clients: $f was not built" >&2; exit 1; }
done

echo "== Kubernetes: a claim prepared by the DRA plugin runs cuda-python in its slice =="
cargo test --release --workspace --test cdi_end_to_end -- --ignored

echo "== real-client suite =="
set +e
"$GPUFUSE_PY" -m pytest tests/real-clients "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "run-real-clients: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
