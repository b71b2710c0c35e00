#!/usr/bin/env bash
# Installs what the real-client test tier needs, into .deps/ in the repository root (git-ignored):
#   .deps/venv     a Python venv with the pinned PyPI packages of tests/real-clients/requirements.txt
#                  (NVIDIA's CUDA 12.9 + 13.5 runtimes, NVRTC, nvcc 13.5, cuBLAS 12.9, CuPy,
#                  cuda-bindings, pytest...)
#   .deps/torch    a second venv with PyTorch's CUDA 13 wheel (tests/real-clients/requirements-torch.txt;
#                  about 3 GB to download, 5.4 GB installed), for the PyTorch tier; its own stamp
#   .deps/env.sh   exports where nvcc, the include dirs and the libcudart/libnvrtc dirs are;
#                  other scripts `source` it.
# Also installs missing apt packages (C/C++ compilers, python venv support, tmux and chromium for
# the observability tests) when it can.
#
# Idempotent: a stamp keyed on the package list (and this script) makes a second run a no-op.
# Needs: Debian (or similar) with Python >= 3.10 and pip, Rust; no GPU.
#
# Usage: setup-test-deps.sh [--brief] [--no-torch]
#   --brief: one line instead of the paths when ready
#   --no-torch: leave out the PyTorch venv (about 3 GB; only the PyTorch tier needs it; the
#               demo passes this)
set -euo pipefail
brief=0
no_torch=0
for arg in "$@"; do
  case "$arg" in
    --brief) brief=1 ;;
    --no-torch) no_torch=1 ;;
    *) echo "setup-test-deps: unknown option $arg (expected --brief or --no-torch)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
root=$PWD
# The resolved path: a .deps shared through a symlink (worktrees) is named where it really is, so
# env.sh is right for every checkout that shares it.
mkdir -p "$root/.deps"
deps=$(cd -P "$root/.deps" && pwd)
venv=$deps/venv
reqs=$root/tests/real-clients/requirements.txt
stamp=$deps/stamp
python=${PYTHON:-python3}

key=$(cat "$reqs" "$0" | sha256sum | cut -d' ' -f1)

print_env() {
  # shellcheck disable=SC1091
  . "$deps/env.sh"
  if [ "$brief" = 1 ]; then
    echo "setup-test-deps: ready, nothing to do (.deps/ is up to date; source $deps/env.sh)"
    return
  fi
  echo "setup-test-deps: ready (source $deps/env.sh)"
  echo "  python          $GPUFUSE_PY"
  echo "  nvcc            $GPUFUSE_NVCC"
  echo "  include 12.9    $GPUFUSE_CUDA12_INCLUDE (crt/: $GPUFUSE_CUDA12_CRT_INCLUDE)"
  echo "  include 13.5    $GPUFUSE_CUDA13_INCLUDE"
  echo "  libcudart 12.9  $GPUFUSE_CUDART12_LIB"
  echo "  libcudart 13.5  $GPUFUSE_CUDART13_LIB"
  echo "  libnvrtc 12.9   $GPUFUSE_NVRTC12_LIB"
  echo "  libnvrtc 13.5   $GPUFUSE_NVRTC13_LIB"
  echo "  libcublas 12.9  ${GPUFUSE_CUBLAS12_LIB:-}"
}

# --- the PyTorch venv (its own stamp, so a change here does not reinstall the other) ---------
torch_venv=$deps/torch
torch_reqs=$root/tests/real-clients/requirements-torch.txt
ensure_torch() {
  [ "$no_torch" = 0 ] || return 0
  local tkey
  tkey=$(cat "$torch_reqs" | sha256sum | cut -d' ' -f1)
  if [ -f "$torch_venv/stamp" ] && [ "$(cat "$torch_venv/stamp")" = "$tkey" ] &&
     [ -x "$torch_venv/bin/python" ]; then
    return
  fi
  mkdir -p "$deps"
  [ -x "$torch_venv/bin/python" ] || "$python" -m venv "$torch_venv"
  local t0=$SECONDS
  echo "setup-test-deps: installing PyTorch (${torch_reqs#"$root"/}) into $torch_venv: a first run"
  echo "  downloads about 3 GB from PyPI (torch's wheel is 539 MB); pip shows each package below."
  "$torch_venv/bin/python" -m pip install -q --upgrade pip
  "$torch_venv/bin/python" -m pip install -r "$torch_reqs"
  "$torch_venv/bin/python" -c 'import torch; assert torch.version.cuda, "not a CUDA build"'
  echo "setup-test-deps: PyTorch installed in $((SECONDS - t0)) s"
  echo "$tkey" >"$torch_venv/stamp"
}

# tmux and Chromium: test_observe.py reads `gpufuse top` off a tmux screen and renders the web
# dashboard in headless Chromium. Checked on every run (also when .deps/ is up to date).
observe_tools() {
  command -v tmux >/dev/null 2>&1 || missing+=(tmux)
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    missing+=(chromium)
}
apt_install_missing() {
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup-test-deps: installing apt packages: ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && [ -x "$venv/bin/python" ] && [ -f "$deps/env.sh" ] \
  && grep -qxF "export GPUFUSE_DEPS=$deps" "$deps/env.sh"; then
  missing=()
  observe_tools
  apt_install_missing
  ensure_torch
  print_env
  exit 0
fi

# --- apt packages (only the missing ones) ---------------------------------------------------
missing=()
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
"$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
observe_tools
apt_install_missing

# --- the venv ---------------------------------------------------------------------------------
mkdir -p "$deps"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup-test-deps: creating $venv"
  "$python" -m venv "$venv"
fi
started=$SECONDS
echo "setup-test-deps: installing the pinned packages of ${reqs#"$root"/} into $venv"
echo "setup-test-deps: a first run downloads about 1.6 GB from PyPI (0.6 GB of it cuBLAS): a few"
echo "  minutes on a fast link; pip shows each package below. Later runs download nothing."
"$venv/bin/python" -m pip install -q --upgrade pip
# pip's own progress: one line per package, and a progress bar for each download on a terminal.
"$venv/bin/python" -m pip install -r "$reqs"
echo "setup-test-deps: packages installed in $((SECONDS - started)) s"

# --- locate the pieces ------------------------------------------------------------------------
nv=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.realpath(list(nvidia.__path__)[0]))')
cu12_inc=$nv/cuda_runtime/include
cu12_crt_inc=$nv/cuda_nvcc/include
cu12_lib=$nv/cuda_runtime/lib
nvrtc12_lib=$nv/cuda_nvrtc/lib
nvrtc12_inc=$nv/cuda_nvrtc/include
cublas12=$nv/cublas
cccl12_inc=$nv/cuda_cccl/include
cu13=$nv/cu13
for f in "$cu13/bin/nvcc" "$cu13/include/cuda_runtime_api.h" "$cu13/lib/libcudart.so.13" \
         "$cu13/lib/libcudart_static.a" "$cu13/lib/libnvrtc.so.13" "$cu12_inc/cuda_runtime_api.h" \
         "$cu12_crt_inc/crt/host_defines.h" \
         "$cu12_lib/libcudart.so.12" "$nvrtc12_lib/libnvrtc.so.12" "$nvrtc12_inc/nvrtc.h" \
         "$cublas12/lib/libcublas.so.12" "$cublas12/lib/libcublasLt.so.12" \
         "$cublas12/include/cublas_v2.h" "$cccl12_inc/nv/target"; do
  [ -e "$f" ] || { echo "setup-test-deps: expected $f after installing the wheels" >&2; exit 1; }
done

cat >"$deps/env.sh" <<EOF
# Generated by scripts/setup-test-deps.sh; source it.
export GPUFUSE_DEPS=$deps
export GPUFUSE_PY=$venv/bin/python
export GPUFUSE_TORCH_PY=$torch_venv/bin/python
export GPUFUSE_NVIDIA=$nv
export GPUFUSE_NVCC=$cu13/bin/nvcc
export GPUFUSE_CUDA12_INCLUDE=$cu12_inc
export GPUFUSE_CUDA12_CRT_INCLUDE=$cu12_crt_inc
export GPUFUSE_CUDA13_INCLUDE=$cu13/include
# Compiler flags for host code against each runtime's headers.
export GPUFUSE_CUDA12_CFLAGS="-I$cu12_inc -I$cu12_crt_inc"
export GPUFUSE_CUDA13_CFLAGS="-I$cu13/include"
export GPUFUSE_CUDART12_LIB=$cu12_lib
export GPUFUSE_CUDART13_LIB=$cu13/lib
export GPUFUSE_NVRTC12_INCLUDE=$nvrtc12_inc
export GPUFUSE_NVRTC12_LIB=$nvrtc12_lib
export GPUFUSE_NVRTC13_LIB=$cu13/lib
export GPUFUSE_CUBLAS12_LIB=$cublas12/lib
export GPUFUSE_CUBLAS12_INCLUDE=$cublas12/include
export GPUFUSE_CCCL12_INCLUDE=$cccl12_inc
case ":\$PATH:" in *":$cu13/bin:"*) ;; *) export PATH="$cu13/bin:\$PATH" ;; esac
EOF

# nvcc must work (it needs nvcc + crt + nvvm wheels and a host g++).
"$cu13/bin/nvcc" --version >/dev/null

echo "$key" >"$stamp"
ensure_torch
print_env
