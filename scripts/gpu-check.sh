#!/usr/bin/env bash
# gpu-check.sh: one command for a GPU machine: runs the CUDA-vs-CPU kernel tests (test_kernels) and prints a
# summary table last, with the same summary written to gpu-report.md and gpu-report.json.
#
#   ./gpu-check.sh                      # inside a bundle (scripts/gpu-bundle.sh): nothing is built; OUT (default:
#                                       # the current folder) receives the log and the report
#   scripts/gpu-check.sh                # in a source tree: configure + build in build-gpu-check/, then run
#   scripts/gpu-check.sh path/to/build  # in a source tree: reuse (and refresh) a CUDA-enabled build directory
#
# Environment: CUDA_ARCHS (source tree only; default 90: the H100/H200), JOBS (default: all cores), OUT (bundle
# only). Exit status: 0 when every test passed (none may be skipped for lack of a GPU).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -x "${here}/run" && -d "${here}/bin" ]]; then
  bundle="${here}"
fi

echo "== GPUs"
nvidia-smi -L || { echo "gpu-check: nvidia-smi failed: no usable NVIDIA driver/GPU here" >&2; exit 1; }

if [[ -n "${bundle:-}" ]]; then
  build_dir="${OUT:-$(pwd)}"
  mkdir -p "${build_dir}"
  test_kernels=("${bundle}/run" test_kernels)
  build_seconds=0
else
  source_dir="$(cd "${here}/.." && pwd)"
  build_dir="${1:-${source_dir}/build-gpu-check}"
  cuda_archs="${CUDA_ARCHS:-90}"
  jobs="${JOBS:-$(nproc)}"
  export PATH="/usr/local/cuda/bin:${PATH}"

  echo "== configure + build (${build_dir})"
  start=$(date +%s)
  if [[ -f "${build_dir}/CMakeCache.txt" ]]; then
    if ! grep -q '^PROPLAB_CUDA:STRING=ON$\|^PROPLAB_CUDA:STRING=AUTO$' "${build_dir}/CMakeCache.txt"; then
      echo "gpu-check: ${build_dir} was configured without CUDA (PROPLAB_CUDA=OFF); give another directory" >&2
      exit 1
    fi
    cmake "${build_dir}" -DPROPLAB_CUDA=ON
  else
    cmake -S "${source_dir}" -B "${build_dir}" -G Ninja -DPROPLAB_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_CUDA_ARCHITECTURES=${cuda_archs}" -DPROPLAB_BENCH=OFF
  fi
  cmake --build "${build_dir}" --target test_kernels -j "${jobs}"
  build_seconds=$(( $(date +%s) - start ))
  test_kernels=("${build_dir}/tests/test_kernels")
fi

echo "== test_kernels"
report="${build_dir}/gpu-check-test_kernels.xml"
log="${build_dir}/gpu-check-test_kernels.log"
set +e
"${test_kernels[@]}" --gtest_output="xml:${report}" 2>&1 | tee "${log}"
test_status=${PIPESTATUS[0]}
set -e

# Summary from the gtest log: one row per test, then totals. Skips count as failures here: this script exists to
# run the GPU path.
echo
echo "== summary"
printf '%-60s %-8s %s\n' "test" "result" "time"
{ grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+ \(' "${log}" || true; } |
  sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+) \(([0-9]+ ms)\).*/\2 \1 \3/' |
  while read -r name result duration; do printf '%-60s %-8s %s\n' "${name}" "${result}" "${duration}"; done
count() { grep -cE "^\\[ +$1 +\\] [A-Za-z0-9_]+\\.[A-Za-z0-9_/]+ \\(" "${log}" || true; }
passed=$(count OK)
failed=$(count FAILED)
skipped=$(count SKIPPED)
printf 'passed %s, failed %s, skipped %s; test_kernels exit %s; build %ss\n' "${passed}" "${failed}" "${skipped}" \
  "${test_status}" "${build_seconds}"
verdict=OK
if [[ "${test_status}" -ne 0 || "${failed}" -ne 0 || "${skipped}" -ne 0 || "${passed}" -eq 0 ]]; then verdict=FAILED; fi
{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ): ${verdict}"
  echo
  nvidia-smi -L | sed 's/^/- /'
  echo
  echo "| test | result | time |"
  echo "|---|---|---|"
  { grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+ \(' "${log}" || true; } |
    sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+) \(([0-9]+ ms)\).*/| \2 | \1 | \3 |/'
  echo
  echo "passed ${passed}, failed ${failed}, skipped ${skipped}; test_kernels exit ${test_status}"
} > "${build_dir}/gpu-report.md"
printf '{"verdict": "%s", "passed": %s, "failed": %s, "skipped": %s, "test_kernels_exit": %s}\n' "${verdict}" \
  "${passed}" "${failed}" "${skipped}" "${test_status}" > "${build_dir}/gpu-report.json"
if [[ "${test_status}" -ne 0 || "${failed}" -ne 0 || "${skipped}" -ne 0 || "${passed}" -eq 0 ]]; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: OK"
