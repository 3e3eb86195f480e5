#!/usr/bin/env bash
# Installs every Debian package kiln needs; idempotent and non-interactive.
# The CUDA toolkit is not installed here: it is used from /usr/local/cuda when present.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev doctest-dev
  libgloo-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  dataset-fashion-mnist
  python3
  binutils xz-utils  # strip and xz for the GPU kit (scripts/gpu_kit.sh)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
