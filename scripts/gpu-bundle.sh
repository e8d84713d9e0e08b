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
# OUT/mpirun is this machine's Open MPI launcher carried along (OUT/mpi: its programs, components, help files and
# libraries, relocated with OPAL_PREFIX), since the bundle's libmpi needs its own runtime and the GPU machine may
# have none; OUT/proplab runs the bundle's proplab (for the multi-rank checks, OUT/tests/dist/*.py).
# On the GPU machine: carry gpu-bundle.tar.xz (the unpacked folder is larger), then
#   tar -xJf gpu-bundle.tar.xz && ./gpu-bundle/gpu-check.sh
# Environment: BUNDLE_MAX_MIB (default 40), the most the compressed bundle may weigh; BUNDLE_XZ_LEVEL (default 6),
# the xz preset (0 packs the 117 MiB folder in 5 s into 34 MiB, 6 in 47 s into 22 MiB: the test of this script
# packs at 0, and a bundle within the limit there is within it at 6).
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
max_mib="${BUNDLE_MAX_MIB:-40}"
xz_level="${BUNDLE_XZ_LEVEL:-6}"
[[ "${xz_level}" =~ ^[0-9]$ ]] || { echo "gpu-bundle: BUNDLE_XZ_LEVEL must be 0..9, got '${xz_level}'" >&2; exit 2; }
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
  echo "== ${out}/mpirun: 2 ranks of test_cuda_communicator_mpi with the carried Open MPI runtime"
  local mpi_check=("${out}/mpirun" -np 2 --oversubscribe "${out}/run" test_cuda_communicator_mpi --gtest_brief=1)
  mkdir -p "${work}/empty"
  if [[ "$(id -u)" == 0 ]] && unshare -m true 2> /dev/null; then
    # This machine's own Open MPI hidden (a private mount namespace), so only the carried runtime can serve.
    local hide="" dir
    for dir in $(cat "${out}/mpi/system-dirs"); do [[ -d "${dir}" ]] && hide+="mount --bind '${work}/empty' '${dir}'; "; done
    env -i PATH=/usr/bin:/bin HOME="${work}" unshare -m bash -c "${hide} exec \"\$@\"" hide "${mpi_check[@]}"
  else
    env -i PATH=/usr/bin:/bin HOME="${work}" "${mpi_check[@]}"
  fi
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
  "${build_dir}/bench/bench_gpu" "${build_dir}/bench/bench_train" "${build_dir}/bench/bench_dist"
  "${build_dir}/tests/test_cuda_communicator_mpi")
# Built only where the build has NCCL.
for optional in "${build_dir}/tests/test_nccl_collectives_mpi" "${build_dir}/bench/bench_nccl"; do
  if [[ -x "${optional}" ]]; then binaries+=("${optional}"); fi
done
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
mkdir -p "${out}/tests/dist"
cp "${source_dir}/tests/dist/check_cuda_parity.py" "${source_dir}/tests/dist/check_fault.py" \
  "${source_dir}/tests/dist/parity_util.py" "${out}/tests/dist/"

# This machine's Open MPI runtime, laid out under OUT/mpi as under its install prefix so that OPAL_PREFIX (and
# PMIX_INSTALL_PREFIX) relocate it: the launcher and its daemon, the components (dlopen'ed from pkglibdir), the help
# files, PMIx's plugins and help files, and every library those load that is not the C library's (OUT/mpi/deps).
command -v ompi_info > /dev/null || { echo "gpu-bundle: ompi_info not found: install Open MPI (scripts/setup-debian.sh)" >&2; exit 2; }
ompi_path() { ompi_info --parsable --path "$1" | awk -F: -v key="$1" '$2 == key {print $3; exit}'; }
mpi_prefix="$(ompi_path prefix)"
mpi_libdir="$(ompi_path libdir)"
mpi_components="$(ompi_path pkglibdir)"
mpi_datadir="$(ompi_path pkgdatadir)"
mpi_bindir="$(ompi_path bindir)"
relative() { echo "${1#"${mpi_prefix}"/}"; }
mkdir -p "${out}/mpi/bin" "${out}/mpi/deps" "${out}/mpi/$(dirname "$(relative "${mpi_components}")")" \
  "${out}/mpi/$(dirname "$(relative "${mpi_datadir}")")"
cp -L "${mpi_bindir}/orterun" "${mpi_bindir}/orted" "${out}/mpi/bin/"
ln -s orterun "${out}/mpi/bin/mpirun"
cp -rL "${mpi_components}" "${out}/mpi/$(relative "${mpi_components}")"
cp -rL "${mpi_datadir}" "${out}/mpi/$(relative "${mpi_datadir}")"
system_dirs=("${mpi_libdir}" "${mpi_datadir}")
# PMIx (an external one, as Debian's): its prefix holds lib/pmix (plugins) and share/pmix (help files).
pmix_library="$(ldd "${mpi_components}"/mca_pmix_*.so 2> /dev/null | awk '$1 ~ /^libpmix/ {print $3}' | head -n 1)"
pmix_path=""
if [[ -n "${pmix_library}" ]]; then
  pmix_prefix="$(dirname "$(dirname "$(readlink -f "${pmix_library}")")")"
  pmix_path="$(relative "${pmix_prefix}")"
  for part in lib/pmix share/pmix; do
    if [[ -d "${pmix_prefix}/${part}" ]]; then
      mkdir -p "${out}/mpi/${pmix_path}/$(dirname "${part}")"
      cp -rL "${pmix_prefix}/${part}" "${out}/mpi/${pmix_path}/${part}"
    fi
  done
  system_dirs+=("${pmix_prefix}")
fi
printf '%s\n' "${system_dirs[@]}" > "${out}/mpi/system-dirs"
find "${out}/mpi/bin" "${out}/mpi/$(relative "${mpi_components}")" ${pmix_path:+"${out}/mpi/${pmix_path}"} -type f \
  \( -name '*.so*' -o -perm -u+x \) -exec ldd {} + 2> /dev/null | awk '/=> \// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ ! "${name}" =~ ${system_pattern} ]]; then cp -L "${path}" "${out}/mpi/deps/${name}"; fi
  done
mpi_libraries="\${here}/mpi/deps"
pmix_line=""
if [[ -n "${pmix_path}" ]]; then pmix_line="export PMIX_INSTALL_PREFIX=\"\${here}/mpi/${pmix_path}\""; fi
cat > "${out}/mpirun" <<MPIRUN
#!/usr/bin/env bash
# Open MPI's launcher as carried in this bundle (relocated with OPAL_PREFIX): mpirun ARGS... as usual.
here="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
export OPAL_PREFIX="\${here}/mpi"
${pmix_line}
export PATH="\${here}/mpi/bin:\${PATH}"
export LD_LIBRARY_PATH="${mpi_libraries}:\${here}/lib\${LD_LIBRARY_PATH:+:\${LD_LIBRARY_PATH}}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec "\${here}/mpi/bin/orterun" "\$@"
MPIRUN
chmod +x "${out}/mpirun"
cat > "${out}/proplab" <<'PROPLAB'
#!/usr/bin/env bash
# The bundle's proplab (through OUT/run, with the bundle's and this machine's CUDA libraries).
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/run" proplab "$@"
PROPLAB
chmod +x "${out}/proplab"
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
XZ_OPT="-${xz_level}" tar -C "$(dirname "${out}")" -cJf "${out}.tar.xz" "$(basename "${out}")"
size_mib=$(( $(stat -c %s "${out}.tar.xz") / 1048576 ))
echo "gpu-bundle: ${out}.tar.xz: $(ls "${out}/bin" | wc -l) binaries, $(ls "${out}/lib" | wc -l) libraries, ${size_mib} MiB"
if (( size_mib > max_mib )); then
  echo "gpu-bundle: the bundle weighs ${size_mib} MiB, more than ${max_mib} MiB" >&2
  exit 1
fi
