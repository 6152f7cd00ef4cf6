#!/usr/bin/env bash
# Builds what the `device` tool's TPU machine lacks (it has jax, libtpu, numpy, scipy, pytest; no torch,
# and no network) as two parts of < 61 MiB each, since one call carries at most 64 MiB with the repo:
# torch 2.13 (the CPU wheel, minus its C++ test binaries, re-packed with xz: 192 MB -> 91 MB), its
# torch_shm_manager, and the pure wheels torch/transformers/accelerate need.
#   .ci/device/make_bundle.sh            -> .whl/parts/p0, .whl/parts/p1 (.whl/ is git-ignored)
# Then, on the device tool, one call per part, the machine staying warm in between:
#   run(command="mkdir -p /tmp/parts && cp .whl/parts/p0 /tmp/parts/ && bash .ci/device/info.sh",
#       carry=[".whl/parts/p0"])
#   run(command="mkdir -p /tmp/parts && cp .whl/parts/p1 /tmp/parts/ && bash .ci/device/tests.sh",
#       carry=[".whl/parts/p1"])
#   run(command="bash .ci/device/bench.sh")
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEEL=${TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/site" "$WORK/bundle/deps"
unzip -q "$WHEEL" -x 'torch/test/*' 'torch/bin/*' -d "$WORK/site"
unzip -q -j "$WHEEL" 'torch/bin/torch_shm_manager' -d "$WORK/bundle"
tar -C "$WORK/site" -cf - . | xz -T2 -6 > "$WORK/bundle/torch213.tar.xz"
# the machine's own numpy/pytest/sympy stay (same versions or newer); hf_xet is optional and large
pip download -q --only-binary=:all: -d "$WORK/bundle/deps" filelock typing_extensions networkx jinja2 markupsafe \
  fsspec mpmath packaging ninja expecttest pytest-timeout "transformers==5.24.0" "accelerate==1.16.0" psutil \
  "$WHEEL"  # pins accelerate's torch to this wheel (else pip fetches a newer CUDA torch: GBs)
rm -f "$WORK"/bundle/deps/{numpy,pytest,pluggy,iniconfig,hf_xet,torch}-*.whl
tar -C "$WORK/bundle" -cf "$WORK/bundle.tar" .
rm -rf .whl/parts && mkdir -p .whl/parts
split -n 2 -d -a 1 "$WORK/bundle.tar" .whl/parts/p
ls -la .whl/parts
