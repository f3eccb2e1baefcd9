#!/usr/bin/env bash
# Installs what dqn-engine needs on a fresh Debian 12 machine and configures the build (idempotent).
# Usage: tools/setup.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
pkgs=(meson ninja-build pkg-config g++ libyaml-cpp-dev libboost-dev libspdlog-dev doctest-dev
      libcli11-dev nlohmann-json3-dev libhdf5-dev python3-numpy python3-matplotlib
      pybind11-dev python3-dev  # the Python module dqn_engine
      libonnx-dev libprotobuf-dev python3-onnx  # dqn export --format onnx, and its test's checker
      python3-torch  # the golden suite's PyTorch peer (tools/bench/torch_peer.py)
      libmujoco-dev libmujoco-samples  # the mujoco environment plugin and its humanoid model
      clang-16 libclang-rt-16-dev)  # tools/sanitize.sh host, tools/fuzz.sh: its ASan, UBSan, libFuzzer
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# nvcc lives outside PATH in the CUDA toolkit's default place.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cd "$here"
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build"
fi
ninja -C "$build"
