#!/usr/bin/env bash
# gpu-check.sh: everything proplab checks on a GPU, in one command and one report. Stages, most important first,
# each under its own time limit and all under one overall budget (a stage that would start past the budget is
# reported as not run):
#   1. test_kernels   every CUDA op against the CPU op, forward and backward, on random inputs
#   2. test_gpu       whole runs on the GPU against the CPU (Pre-LN, Post-LN, no-norm transformers, the MLP,
#                     a BatchNorm ResNet-20), determinism, checkpoints across devices, out of GPU memory
#   3. bench_gpu      studies/gpt2_124m.toml on the GPU: recording off / every 10 steps / every step
#   4. torch          PyTorch on the same card: GPT-2 124M bf16 + torch.compile, ResNet-56 bf16 channels-last
#                     + torch.compile, GPT-2 124M fp32 eager (when the machine's python3 has torch with CUDA)
#   5. deep1000       studies/deep1000_deepscalelm.toml: a 1000-layer transformer trains, records, checkpoints
# and, for CUDA ranks (mpirun: the bundle's own Open MPI, or the machine's in a source tree):
#   6. cuda_communicator   test_cuda_communicator_mpi on 2 ranks sharing the GPU (every collective staged)
#   7. cuda_parity_staged  tests/dist/check_cuda_parity.py staged: dp, tp, pp, dp x tp, dp x pp, sp, dp x sp on
#                          ranks sharing the GPU against the one-GPU run, determinism, local SGD/gossip, ZeRO-1,
#                          resume, compressed exchange and boundaries against CPU ranks
#   8. nccl_one_rank       NCCL itself on one rank: test_nccl_collectives_mpi, then bench_nccl (where built)
#   9. cuda_parity_nccl    check_cuda_parity.py nccl: the layouts over NCCL with one GPU per rank, or (fewer GPUs
#                          than 4) the refusal naming parallel.comm
#  10. cuda_fault          check_fault.py with CUDA ranks (staged): a stalled rank ends the job within timeout_s
#  11. bench_dist_cuda     bench_dist on 2 CUDA ranks sharing the GPU (staged): ms/step, bytes/step against the
#                          formula, and the measured overlap of the bucketed exchange with backward (--overlap)
# Writes OUT/gpu-report.md (every failure with its numbers, the benchmark tables) and OUT/gpu-report.json (one
# object: verdict, per-stage results, every benchmark line), plus one log per stage.
#
#   ./gpu-check.sh                      # inside a bundle (scripts/gpu-bundle.sh): nothing is built; OUT (default:
#                                       # the current folder) receives the logs and the report
#   scripts/gpu-check.sh                # in a source tree: configure + build in build-gpu-check/, then run
#   scripts/gpu-check.sh path/to/build  # in a source tree: reuse (and refresh) a CUDA-enabled build directory
#
# Environment: STAGES ("single", "multi" or "all", the default: which of the stages above run: 1-5, 6-10, all),
# BUDGET_S (default 420 for single or multi, 780 for all: the whole check), CUDA_ARCHS (source tree only; default 90: the H100/H200),
# JOBS (default: all cores), OUT (bundle only). Exit status: 0 when every test passed (a skip counts as a failure
# here: this script exists to run the GPU path) and every benchmark ran.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -x "${here}/run" && -d "${here}/bin" ]]; then
  bundle="${here}"
fi
stages="${STAGES:-all}"
case "${stages}" in
  single | multi) budget="${BUDGET_S:-420}" ;;
  all) budget="${BUDGET_S:-780}" ;;
  *) echo "gpu-check: STAGES=${stages}: allowed: single, multi, all" >&2; exit 2 ;;
esac
start_all=$(date +%s)

echo "== GPUs"
nvidia-smi -L || { echo "gpu-check: nvidia-smi failed: no usable NVIDIA driver/GPU here" >&2; exit 1; }

if [[ -n "${bundle:-}" ]]; then
  out_dir="${OUT:-$(pwd)}"
  mkdir -p "${out_dir}"
  out_dir="$(cd "${out_dir}" && pwd)"
  runner="${bundle}/run"
  studies="${bundle}/studies"
  torch_script="${bundle}/bench/torch_gpu_reference.py"
  mpiexec="${bundle}/mpirun"
  proplab_program="${bundle}/proplab"
  dist_checks="${bundle}/tests/dist"
else
  source_dir="$(cd "${here}/.." && pwd)"
  build_dir="${1:-${source_dir}/build-gpu-check}"
  export PATH="/usr/local/cuda/bin:${PATH}"
  echo "== configure + build (${build_dir})"
  if [[ -f "${build_dir}/CMakeCache.txt" ]]; then
    cmake "${build_dir}" -DPROPLAB_CUDA=ON || exit 1
  else
    cmake -S "${source_dir}" -B "${build_dir}" -G Ninja -DPROPLAB_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}" || exit 1
  fi
  cmake --build "${build_dir}" --target proplab test_kernels test_gpu bench_gpu bench_dist test_cuda_communicator_mpi \
    -j "${JOBS:-$(nproc)}" || exit 1
  cmake --build "${build_dir}" --target test_nccl_collectives_mpi bench_nccl -j "${JOBS:-$(nproc)}" 2> /dev/null || true
  out_dir="$(cd "${build_dir}" && pwd)"
  # The bundle's `run BINARY ARGS...` for a build tree (timeout needs a program, not a shell function).
  runner="${out_dir}/gpu-check-run"
  cat > "${runner}" <<EOF
#!/usr/bin/env bash
name="\$1"
shift
case "\${name}" in
  proplab) exec "${out_dir}/proplab" "\$@" ;;
  bench_*) exec "${out_dir}/bench/\${name}" "\$@" ;;
  *) exec "${out_dir}/tests/\${name}" "\$@" ;;
esac
EOF
  chmod +x "${runner}"
  studies="${source_dir}/studies"
  torch_script="${source_dir}/bench/torch_gpu_reference.py"
  mpiexec="$(command -v mpirun || true)"
  proplab_program="${out_dir}/proplab"
  dist_checks="${source_dir}/tests/dist"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cd "${out_dir}" || exit 1

stage_names=()
stage_results=()
bench_lines=()
failures=0

# The seconds a stage may take: its own limit, or what is left of the budget if that is less (0: none left).
allowance() {
  local own="$1" left=$(( budget - ($(date +%s) - start_all) ))
  (( left < 0 )) && left=0
  echo $(( own < left ? own : left ))
}

# run_stage NAME LIMIT_S COMMAND...: runs the command under `timeout`, its output in NAME.log; records the result.
run_stage() {
  local name="$1" limit
  limit="$(allowance "$2")"
  shift 2
  stage_names+=("${name}")
  if (( limit < 10 )); then
    echo "== ${name}: not run (the ${budget} s budget is spent)"
    stage_results+=("not run: budget spent")
    failures=$(( failures + 1 ))
    return
  fi
  echo "== ${name} (at most ${limit} s)"
  local begin status
  begin=$(date +%s)
  timeout --kill-after=10 "${limit}" "$@" > "${name}.log" 2>&1
  status=$?
  tail -n 40 "${name}.log"
  local took=$(( $(date +%s) - begin ))
  if (( status == 124 || status == 137 )); then
    stage_results+=("timed out after ${took} s")
    failures=$(( failures + 1 ))
  elif (( status != 0 )); then
    stage_results+=("exit ${status} after ${took} s")
    failures=$(( failures + 1 ))
  else
    stage_results+=("ok in ${took} s")
  fi
}

# A gtest binary's results as markdown: counts, then every failed or skipped test with its failure lines.
gtest_section() {
  local log="$1"
  local passed failed skipped
  passed=$(grep -cE '^\[ +OK +\] ' "${log}" 2> /dev/null || true)
  failed=$(grep -cE '^\[ +FAILED +\] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+ \(' "${log}" 2> /dev/null || true)
  skipped=$(grep -cE '^\[ +SKIPPED +\] [A-Za-z0-9_]+\.[A-Za-z0-9_/]+ \(' "${log}" 2> /dev/null || true)
  echo "passed ${passed}, failed ${failed}, skipped ${skipped}"
  (( skipped > 0 )) && failures=$(( failures + skipped ))
  (( failed > 0 || skipped > 0 )) || return 0
  echo
  echo '```'
  # Each failed or skipped test's own lines (from its RUN line to its result line), at most 30 lines each.
  awk '/^\[ RUN      \]/ {buffer = $0 "\n"; lines = 1; next}
       /^\[ +(FAILED|SKIPPED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_\/]+ \(/ {printf "%s%s\n\n", buffer, $0; buffer = ""; next}
       /^\[ +OK +\]/ {buffer = ""; next}
       {if (lines < 30) {buffer = buffer $0 "\n"; lines++}}' "${log}"
  echo '```'
}

single_stages() {
  run_stage test_kernels 150 "${runner}" test_kernels --gtest_color=no
  run_stage test_gpu 200 "${runner}" test_gpu --gtest_color=no
  run_stage bench_gpt2 120 "${runner}" bench_gpu "${studies}/gpt2_124m.toml" --steps 8 --warmup 2 --modes off,10,1 \
    --out "${out_dir}/bench-runs"
  python=""
  for candidate in python3 /usr/bin/python3; do
    if command -v "${candidate}" > /dev/null && "${candidate}" -c 'import torch; assert torch.cuda.is_available()' \
      2> /dev/null; then
      python="${candidate}"
      break
    fi
  done
  if [[ -n "${python}" ]]; then
    run_stage torch_gpt2_bf16_compiled 150 "${python}" "${torch_script}" --model gpt2 --precision bf16 --compile
  else
    stage_names+=("torch")
    stage_results+=("not run: no python3 with torch and CUDA")
    failures=$(( failures + 1 ))
  fi
  run_stage deep1000 100 "${runner}" bench_gpu "${studies}/deep1000_deepscalelm.toml" --steps 4 --warmup 2 --modes 10 \
    --out "${out_dir}/bench-runs"
  if [[ -n "${python}" ]]; then
    run_stage torch_resnet56_bf16_compiled 100 "${python}" "${torch_script}" --model resnet56 --precision bf16 \
      --compile --channels-last
    run_stage torch_gpt2_fp32 60 "${python}" "${torch_script}" --model gpt2 --precision fp32
  fi
}

# The multi-rank stages: every rank on this machine's GPU(s), one OpenMP thread each.
has_binary() { [[ -n "${bundle:-}" && -x "${bundle}/bin/$1" ]] || [[ -z "${bundle:-}" && ( -x "${out_dir}/tests/$1" || -x "${out_dir}/bench/$1" ) ]]; }
multi_stages() {
  if [[ -z "${mpiexec}" ]]; then
    stage_names+=("multi-rank")
    stage_results+=("not run: no mpirun")
    failures=$(( failures + 1 ))
    return
  fi
  local checks_python=""
  for candidate in python3 /usr/bin/python3; do
    if command -v "${candidate}" > /dev/null && "${candidate}" -c 'import h5py, numpy' 2> /dev/null; then
      checks_python="${candidate}"
      break
    fi
  done
  export OMP_NUM_THREADS=1
  run_stage cuda_communicator 60 "${mpiexec}" -np 2 --oversubscribe "${runner}" test_cuda_communicator_mpi \
    --gtest_color=no
  if [[ -n "${checks_python}" ]]; then
    run_stage cuda_parity_staged 240 "${checks_python}" "${dist_checks}/check_cuda_parity.py" "${proplab_program}" \
      "${mpiexec}" "${out_dir}/cuda-parity-staged" staged
  fi
  if has_binary test_nccl_collectives_mpi; then
    run_stage nccl_one_rank 60 "${mpiexec}" -np 1 "${runner}" test_nccl_collectives_mpi --gtest_color=no
  fi
  if has_binary bench_nccl; then
    run_stage bench_nccl_one_rank 90 "${mpiexec}" -np 1 "${runner}" bench_nccl --max-bytes 268435456 \
      --json "${out_dir}/bench-nccl-1.json"
  fi
  if [[ -n "${checks_python}" ]]; then
    run_stage cuda_parity_nccl 200 "${checks_python}" "${dist_checks}/check_cuda_parity.py" "${proplab_program}" \
      "${mpiexec}" "${out_dir}/cuda-parity-nccl" nccl
    run_stage cuda_fault 60 "${checks_python}" "${dist_checks}/check_fault.py" "${proplab_program}" "${mpiexec}" \
      "${out_dir}/cuda-fault" --set device.type=cuda --set parallel.comm=staged
    run_stage bench_dist_cuda 120 "${mpiexec}" -np 2 --oversubscribe "${runner}" bench_dist --steps 12 --threads 1 \
      --set device.type=cuda --set parallel.dp=2 --set parallel.comm=staged --overlap --out "${out_dir}/bench-dist-runs"
  else
    stage_names+=("cuda_parity")
    stage_results+=("not run: no python3 with h5py and numpy")
    failures=$(( failures + 1 ))
  fi
}

if [[ "${stages}" != multi ]]; then single_stages; fi
if [[ "${stages}" != single ]]; then multi_stages; fi

for name in "${stage_names[@]}"; do
  [[ -f "${name}.log" ]] || continue
  while IFS= read -r line; do bench_lines+=("${line}"); done < <(grep -E '^\{"bench": ' "${name}.log" || true)
done

verdict=OK
{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  nvidia-smi -L | sed 's/^/- /'
  echo
  echo "| stage | result |"
  echo "|---|---|"
  for i in "${!stage_names[@]}"; do echo "| ${stage_names[$i]} | ${stage_results[$i]} |"; done
  for name in test_kernels test_gpu cuda_communicator nccl_one_rank; do
    [[ -f "${name}.log" ]] || continue
    echo
    echo "## ${name}"
    echo
    gtest_section "${name}.log"
  done
  for name in bench_gpt2 deep1000 cuda_parity_staged bench_nccl_one_rank cuda_parity_nccl cuda_fault bench_dist_cuda; do
    [[ -f "${name}.log" ]] || continue
    echo
    echo "## ${name}"
    echo
    echo '```'
    grep -vE '^\{"bench": ' "${name}.log" | tail -n 20
    echo '```'
  done
  if (( ${#bench_lines[@]} > 0 )); then
    echo
    echo "## benchmark lines"
    echo
    echo '```'
    printf '%s\n' "${bench_lines[@]}"
    echo '```'
  fi
} > gpu-report.md.partial
(( failures > 0 )) && verdict=FAILED
{
  echo "verdict: ${verdict} (${failures} problems; $(( $(date +%s) - start_all )) s)"
  cat gpu-report.md.partial
} > gpu-report.md
rm -f gpu-report.md.partial
{
  printf '{"verdict": "%s", "problems": %s, "seconds": %s, "stages": {' "${verdict}" "${failures}" \
    "$(( $(date +%s) - start_all ))"
  for i in "${!stage_names[@]}"; do
    (( i > 0 )) && printf ', '
    printf '"%s": "%s"' "${stage_names[$i]}" "${stage_results[$i]}"
  done
  printf '}, "bench": ['
  for i in "${!bench_lines[@]}"; do
    (( i > 0 )) && printf ', '
    printf '%s' "${bench_lines[$i]}"
  done
  printf ']}\n'
} > gpu-report.json
echo
cat gpu-report.md
echo "gpu-check: ${verdict} (report: ${out_dir}/gpu-report.md, ${out_dir}/gpu-report.json)"
[[ "${verdict}" == OK ]]
