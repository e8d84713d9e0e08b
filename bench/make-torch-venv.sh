#!/usr/bin/env bash
# bench/make-torch-venv.sh [DIR]: a bench-only virtual environment with PyTorch 2.x from PyPI, the speed yardstick
# of bench_train and bench_resnet (bench/torch_reference.py). Not part of CI or the README's two commands.
#
# DIR defaults to .bench-venv at the repository root, where the benchmarks look for it (PROPLAB_TORCH_PYTHON
# names another interpreter). It is built on Debian's /usr/bin/python3 (python3-venv; torch.compile also needs
# python3-dev and g++, which scripts/setup-debian.sh installs). The download is several GiB: PyPI's torch wheel
# brings its CUDA libraries, which the CPU benchmarks never load.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/.bench-venv}
python=/usr/bin/python3
if ! "$python" -c "import venv, ensurepip" 2>/dev/null; then
  echo "make-torch-venv: $python has no venv/ensurepip; install python3-venv (apt-get install python3-venv)" >&2
  exit 2
fi
if [[ ! -x $dir/bin/python ]]; then
  echo "make-torch-venv: creating $dir" >&2
  "$python" -m venv "$dir"
fi
echo "make-torch-venv: installing torch>=2.4 from PyPI into $dir" >&2
"$dir/bin/python" -m pip install --quiet --upgrade pip
"$dir/bin/python" -m pip install --quiet "torch>=2.4" numpy
"$dir/bin/python" - <<'PY'
import sys
import torch
major, minor = (int(p) for p in torch.__version__.split(".")[:2])
if (major, minor) < (2, 4):
    sys.exit(f"make-torch-venv: got torch {torch.__version__}, need >= 2.4")
print(f"make-torch-venv: torch {torch.__version__} (mkldnn {torch.backends.mkldnn.is_available()}, "
      f"MKL {torch.backends.mkl.is_available()}) in {sys.prefix}")
PY
