#!/usr/bin/env bash
# Regenerates docs/examples/gui-runs/*.h5 (three short runs of deep16.toml) and the screenshots in docs/images/
# that docs/gui.md shows, with `proplab run` and `proplab-gui --screenshot` (headless: no display needed); the
# ResNet screenshots come from studies/resnet_spp.toml, swept into a temporary folder (about 15 s).
#   docs/examples/make-gui-images.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
runs=docs/examples/gui-runs
images=docs/images
if [ "${KEEP_RUNS:-0}" != 1 ]; then
  rm -rf "$runs"
  for variant in "pre_ln_standard pre standard" "post_ln_standard post standard" "pre_ln_deepscalelm pre deepscalelm"; do
    set -- $variant
    "$build/proplab" run docs/examples/deep16.toml --out "$runs" --force \
      --set name="$1" --set model.norm="$2" --set scaling.rule="$3"
  done
  rm -f "$runs"/*.ckpt.h5
fi
mkdir -p "$images"
gui="$build/proplab-gui"
"$gui" --screenshot "$images/gui-app.png" --full --kind residual --size 1600x900 "$runs"
"$gui" --screenshot "$images/gui-depth-forward.png" --kind residual --record 0 --size 1200x700 "$runs"
"$gui" --screenshot "$images/gui-depth-backward.png" --backward --kind residual --record 0 --size 1200x700 "$runs"
"$gui" --screenshot "$images/gui-dynamics.png" --view dynamics --size 1200x700 "$runs"
"$gui" --screenshot "$images/gui-heatmap.png" --view heatmap --backward --size 1200x700 "$runs/post_ln_standard.h5"
"$gui" --screenshot "$images/gui-compare.png" --view compare --group scaling.rule --kind residual --size 1200x500 "$runs"
# A vector figure, exported by the tool itself (docs/gui.md, Export).
"$gui" --export "$images/gui-export-depth.svg" --view depth --record 0 --size 900x520 "$runs"
# The paper figure of the sweep: forward and gradient variance by scaling rule, init and last record.
"$gui" --export "$images/gui-grid.svg" --view grid --size 1000x640 "$runs"
resnets=$(mktemp -d)
trap 'rm -rf "$resnets"' EXIT
"$build/proplab" sweep studies/resnet_spp.toml --out "$resnets" > /dev/null
"$gui" --screenshot "$images/gui-resnet-depth.png" --kind residual --record 0 --size 1200x700 \
  "$resnets/norm=batchnorm,rule=standard.h5" "$resnets/norm=none,rule=nf.h5"
"$gui" --screenshot "$images/gui-resnet-heatmap.png" --view heatmap --kind residual --size 1200x700 \
  "$resnets/norm=batchnorm,rule=standard.h5"
