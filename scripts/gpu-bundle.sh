#!/usr/bin/env bash
# gpu-bundle.sh: packs a CUDA build of proplab into a self-contained bundle for a GPU machine on which nothing is
# built (no compiler, no package manager): the binaries, every shared library they load that is not the C library
# or CUDA, and a launcher. The machine's own CUDA libraries (its driver, and cudart/cuBLAS/cuDNN/NCCL from its
# Python's nvidia packages or a CUDA install) are found at run time by the launcher.
#
#   scripts/gpu-bundle.sh [BUILD_DIR [OUT]]    pack BUILD_DIR (default build/, a --preset default build with CUDA)
#                                              into OUT/ (default gpu-bundle/) and OUT.tar.xz
#   scripts/gpu-bundle.sh --check OUT          start the bundle with only its own libraries (plus this machine's
#                                              CUDA): proplab --version, a CPU run of a tiny study, test_kernels
#                                              and test_gpu (their CUDA tests skip without a GPU), bench_gpu
#                                              (exits 2 without a GPU)
#
# In the bundle: OUT/gpu-check.sh runs the CUDA checks and writes gpu-report.md/json (nothing is built there);
# OUT/run BINARY [ARGS...] runs bin/BINARY with LD_LIBRARY_PATH = OUT/lib + the CUDA library
# folders it finds, after checking with ldd that every library resolves (it names each one that does not).
# On the GPU machine: carry gpu-bundle.tar.xz (the unpacked folder is larger), then
#   tar -xJf gpu-bundle.tar.xz && ./gpu-bundle/gpu-check.sh
# Environment: BUNDLE_MAX_MIB (default 40), the most the compressed bundle may weigh.
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
max_mib="${BUNDLE_MAX_MIB:-40}"
# Shared libraries left to the machine: the C library and the dynamic loader, and CUDA's.
system_pattern='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libcuda\.so|libcudart\.so|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink|libcufft|libcurand|libcusparse|libcusolver)'

check_bundle() {
  local out="$1"
  [[ -x "${out}/run" ]] || { echo "gpu-bundle: ${out} is not a bundle (no ${out}/run)" >&2; exit 2; }
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "${work}"' RETURN
  echo "== every library but the C library's and CUDA's comes from ${out}/lib"
  local binary foreign
  for binary in $(ls "${out}/bin"); do
    foreign="$(env -i PATH=/usr/bin:/bin "${out}/run" --ldd "${binary}" | awk '/=> / {print $1, $3}' |
      grep -Ev "${system_pattern}" | grep -v " ${out}/lib/" || true)"
    if [[ -n "${foreign}" ]]; then
      echo "gpu-bundle: ${binary} loads libraries from outside the bundle:" >&2
      echo "${foreign}" >&2
      exit 1
    fi
  done
  echo "== ${out}/run proplab --version"
  env -i PATH=/usr/bin:/bin HOME="${work}" "${out}/run" proplab --version
  echo "== a CPU run"
  cat > "${work}/tiny.toml" <<'EOF'
name = "tiny"
[model]
layers = 1
width = 16
heads = 2
vocab = 16
seq_len = 8
[train]
steps = 5
batch = 4
[device]
type = "cpu"
threads = 1
EOF
  (cd "${work}" && env -i PATH=/usr/bin:/bin HOME="${work}" "${out}/run" proplab run tiny.toml --out out)
  echo "== ${out}/run test_kernels"
  env -i PATH=/usr/bin:/bin HOME="${work}" "${out}/run" test_kernels --gtest_brief=1
  echo "== ${out}/run test_gpu"
  env -i PATH=/usr/bin:/bin HOME="${work}" "${out}/run" test_gpu --gtest_brief=1
  echo "== ${out}/run bench_gpu (refuses without a GPU)"
  local status=0
  env -i PATH=/usr/bin:/bin HOME="${work}" "${out}/run" bench_gpu "${out}/studies/gpt2_124m.toml" || status=$?
  if [[ "${status}" -ne 2 ]] && ! command -v nvidia-smi > /dev/null; then
    echo "gpu-bundle: bench_gpu without a GPU should exit 2, exited ${status}" >&2
    exit 1
  fi
  echo "gpu-bundle: ${out} starts with its own libraries"
}

if [[ "${1:-}" == "--check" ]]; then
  check_bundle "$(cd "${2:?usage: gpu-bundle.sh --check OUT}" && pwd)"
  exit 0
fi

build_dir="$(cd "${1:-${source_dir}/build}" && pwd)"
out="${2:-${source_dir}/gpu-bundle}"
binaries=("${build_dir}/proplab" "${build_dir}/tests/test_kernels" "${build_dir}/tests/test_gpu"
  "${build_dir}/bench/bench_gpu" "${build_dir}/bench/bench_train")
# bench_nccl when the build has NCCL (one rank without a launcher: NCCL's per-call latency on one GPU).
if [[ -x "${build_dir}/bench/bench_nccl" ]]; then binaries+=("${build_dir}/bench/bench_nccl"); fi
for binary in "${binaries[@]}"; do
  [[ -x "${binary}" ]] || { echo "gpu-bundle: ${binary} is missing: build with CUDA first (cmake --preset default && cmake --build --preset default)" >&2; exit 2; }
done
# (ldd's output captured first: `grep -q` would stop reading early, and under pipefail ldd's broken pipe fails the test)
kernels_libraries="$(ldd "${build_dir}/tests/test_kernels")"
if [[ "${kernels_libraries}" != *libcudart* ]]; then
  echo "gpu-bundle: ${build_dir} was built without CUDA (test_kernels does not load libcudart)" >&2
  exit 2
fi

rm -rf "${out}" "${out}.tar.xz"
mkdir -p "${out}/bin" "${out}/lib"
for binary in "${binaries[@]}"; do cp "${binary}" "${out}/bin/"; done
# Every library the binaries load (ldd lists them transitively), but the machine's own.
ldd "${binaries[@]}" | awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
  if [[ ! "${name}" =~ ${system_pattern} ]]; then cp -L "${path}" "${out}/lib/${name}"; fi
done
cp -r "${source_dir}/studies" "${out}/studies"
cp "${source_dir}/scripts/gpu-check.sh" "${out}/gpu-check.sh"
mkdir -p "${out}/bench"
cp "${source_dir}/bench/torch_gpu_reference.py" "${out}/bench/"
cat > "${out}/run" <<'EOF'
#!/usr/bin/env bash
# Runs one of the bundle's binaries with the bundle's libraries and this machine's CUDA libraries.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
binary="${1:?usage: run BINARY [ARGS...] | run --ldd BINARY (binaries: $(ls "${here}/bin" | tr '\n' ' '))}"
shift
[[ "${binary}" == "--ldd" || -x "${here}/bin/${binary}" ]] || { echo "run: no binary ${binary} in ${here}/bin" >&2; exit 2; }
paths="${here}/lib"
# CUDA: a Python's nvidia packages (pip's nvidia-*-cu13), then a CUDA install, then what the caller set.
for python in python3 /usr/bin/python3; do
  if command -v "${python}" > /dev/null 2>&1; then
    found="$("${python}" - 2> /dev/null <<'PY' || true
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for root in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib"))):
        print(lib)
PY
)"
    for dir in ${found}; do paths="${paths}:${dir}"; done
    break
  fi
done
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d "${dir}" ]] && paths="${paths}:${dir}"; done
export LD_LIBRARY_PATH="${paths}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
if [[ "${binary}" == "--ldd" ]]; then exec ldd "${here}/bin/${1:?usage: run --ldd BINARY}"; fi
missing="$(ldd "${here}/bin/${binary}" | awk '/not found/ {print $1}')"
if [[ -n "${missing}" ]]; then
  echo "run: ${binary} needs libraries this machine does not have: ${missing//$'\n'/, }" >&2
  echo "run: searched ${LD_LIBRARY_PATH} (CUDA libraries come from pip's nvidia packages or /usr/local/cuda)" >&2
  exit 127
fi
exec "${here}/bin/${binary}" "$@"
EOF
chmod +x "${out}/run"
tar -C "$(dirname "${out}")" -cJf "${out}.tar.xz" "$(basename "${out}")"
size_mib=$(( $(stat -c %s "${out}.tar.xz") / 1048576 ))
echo "gpu-bundle: ${out}.tar.xz: $(ls "${out}/bin" | wc -l) binaries, $(ls "${out}/lib" | wc -l) libraries, ${size_mib} MiB"
if (( size_mib > max_mib )); then
  echo "gpu-bundle: the bundle weighs ${size_mib} MiB, more than ${max_mib} MiB" >&2
  exit 1
fi
