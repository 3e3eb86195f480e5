#!/usr/bin/env bash
# Installs every Debian package kiln needs; idempotent and non-interactive.
# The CUDA toolkit is not installed here: it is used from /usr/local/cuda when present.
#
#   setup.sh           what building and training need
#   setup.sh --tests   also what the interop tests need (scripts/test.sh, so CI, uses it):
#                      Debian's python3-torch (with OpenBLAS) and python3-venv, then a
#                      virtual environment .venv, made with --system-site-packages so it
#                      sees that torch, holding safetensors and tensorboard from PyPI
#                      (scripts/python-requirements.txt, pinned)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=false
case "${1:-}" in
  "") ;;
  --tests) with_tests=true ;;
  *) echo "setup.sh: unknown argument '$1' (expected nothing or --tests)" >&2; exit 2 ;;
esac

packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev doctest-dev
  libgloo-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  dataset-fashion-mnist
  python3
  binutils xz-utils  # strip and xz for the GPU kit (scripts/gpu_kit.sh)
  iproute2  # `ip netns`: the two-node tests (tests/test_distributed_netns.cpp)
)
if $with_tests; then
  # --no-install-recommends below keeps python3-torch's closure to what it
  # links (about 170 packages, 30 s on the development machine).
  packages+=(python3-torch libopenblas0-pthread python3-venv)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh machine has no package lists.
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! $with_tests; then exit 0; fi

# The interop checks' Python. Debian's python3 is the base (its torch is the
# one installed above; a pyenv or conda python3 first on PATH would not see it).
venv=.venv
requirements=scripts/python-requirements.txt
stamp="$venv/installed-requirements.txt"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp" &&
   "$venv/bin/python" -c 'import torch, safetensors.torch, tensorboard' 2>/dev/null; then
  echo "setup: $venv has torch, safetensors and tensorboard"
  exit 0
fi
echo "setup: making $venv (--system-site-packages) with $(grep -v '^#' "$requirements" | xargs)"
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --only-binary :all: \
  -r "$requirements"
"$venv/bin/python" -c 'import torch, safetensors.torch, tensorboard'
cp "$requirements" "$stamp"
