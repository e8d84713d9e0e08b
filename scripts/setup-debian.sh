#!/usr/bin/env bash
# Installs what proplab needs to build and test on Debian 12 / Ubuntu 22.04+ (uses sudo when not root).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libopenblas-openmp-dev libhdf5-dev hdf5-tools libtomlplusplus-dev libcli11-dev
  # oneDNN's sgemm, loaded at run time by ops::sgemm when present (src/ops/gemm.h; faster than OpenBLAS's on AVX-512).
  libdnnl2
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-h5py python3-numpy
  # The Python package (python/proplab: run files as pandas DataFrames) and its test, which also installs it with pip
  # into a temporary virtual environment.
  python3-pandas python3-pip python3-venv
  # Multi-process runs and tests (src/dist): Open MPI.
  libopenmpi-dev openmpi-bin
  # ResNet image data (src/data/images.h): gzip'd IDX files read through zlib; Fashion-MNIST for the depth study.
  zlib1g-dev dataset-fashion-mnist
  # Real text for byte-level language models: the Jargon File (public domain, 1.4 MB of English prose), read through
  # zlib from dictd's gzip-compatible /usr/share/dictd/jargon.dict.dz (studies/deepscalelm_shapes.toml).
  dict-jargon
  # proplab-gui (docs/gui.md): Dear ImGui with its GLFW/OpenGL3 backends, stb, EGL + Mesa for headless frames,
  # Xvfb for the start-up test.
  libimgui-dev libglfw3-dev libstb-dev libegl-dev libopengl-dev libgl1 libegl-mesa0 libgl1-mesa-dri xvfb xauth
)
as_root=()
if [ "$(id -u)" -ne 0 ]; then as_root=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "proplab: dependencies installed"
