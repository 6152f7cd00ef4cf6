# Source me on the TPU machine, from the repo root, once both parts are in /tmp/parts: unpacks torch 2.13
# (the CPU wheel minus its C++ test binaries) and the carried wheels into /tmp/site.
if [ ! -f /tmp/site/.done ]; then
  mkdir -p /tmp/site /tmp/bundle
  ls -la /tmp/parts
  cat /tmp/parts/p* | tee >(sha256sum >&2) | tar -x -C /tmp/bundle || return 1
  xz -d -T4 < /tmp/bundle/torch213.tar.xz | tar -x -C /tmp/site || return 1
  mkdir -p /tmp/site/torch/bin && install -m 755 /tmp/bundle/torch_shm_manager /tmp/site/torch/bin/ || return 1
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site /tmp/bundle/deps/*.whl || return 1
  touch /tmp/site/.done
fi
# carried packages first (no jax/numpy among them: the machine's own stay), then the machine's, then the repo
export PYTHONPATH=/tmp/site:${PYTHONPATH}:$PWD
export PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1
