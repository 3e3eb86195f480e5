#!/usr/bin/env bash
# Stages what scripts/gpu_run.sh needs on a GPU machine that has no package
# registry (see /work/shared/GPU.md), into .stage/ (git-ignored; carry it along):
#   .stage/debs/     the Debian packages kiln builds against (apt-get download)
#   .stage/include/  cuDNN and NCCL headers of this machine's CUDA toolkit, a
#                    fallback for a GPU machine whose cuDNN/NCCL come without them
# Run on the development machine, from anywhere:
#   bash scripts/stage_gpu_debs.sh               build dependencies (a few MiB)
#   bash scripts/stage_gpu_debs.sh --with-data   also dataset-fashion-mnist (30 MiB),
#                                                for the tests and examples that read it
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stage="$repo/.stage"
debs="$stage/debs"

# GPU.md's list, plus zlib1g-dev: kiln's CMake requires ZLIB (gzip) and a
# GPU image may lack its headers. cp -n on the GPU machine never overwrites
# what is already installed there.
packages=(
  libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev
  libgloo-dev libgloo0
  libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
  zlib1g-dev
)

case "${1:-}" in
  "") ;;
  --with-data) packages+=(dataset-fashion-mnist) ;;
  *) echo "usage: $0 [--with-data]" >&2; exit 2 ;;
esac

command -v apt-get >/dev/null || { echo "stage_gpu_debs: apt-get not found (run this on the Debian development machine)" >&2; exit 1; }

mkdir -p "$debs"
rm -f "$debs"/*.deb
echo "stage_gpu_debs: downloading ${#packages[@]} packages into $debs"
if ! (cd "$debs" && apt-get download "${packages[@]}"); then
  echo "stage_gpu_debs: apt-get download failed; refreshing the package lists and trying once more" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  (cd "$debs" && apt-get download "${packages[@]}")
fi

# Every package must have produced exactly one .deb.
for package in "${packages[@]}"; do
  matches=("$debs/${package}"_*.deb)
  if [ ! -e "${matches[0]}" ]; then
    echo "stage_gpu_debs: no .deb for $package in $debs" >&2
    exit 1
  fi
done

# Header fallback from this machine's toolkit (cuDNN 9 and NCCL 2 keep their ABI
# within a major version; gpu_run.sh prefers headers found on the GPU machine).
rm -rf "${stage:?}/include"
mkdir -p "$stage/include"
copied=0
for dir in /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu; do
  for header in "$dir"/cudnn*.h "$dir"/nccl*.h; do
    [ -f "$header" ] || continue
    name="$(basename "$header")"
    [ -e "$stage/include/$name" ] && continue
    cp -L "$header" "$stage/include/$name"
    copied=$((copied + 1))
  done
  # nccl_device.h includes headers from this folder.
  if [ -d "$dir/nccl_device" ] && [ ! -e "$stage/include/nccl_device" ]; then
    cp -rL "$dir/nccl_device" "$stage/include/"
  fi
done
echo "stage_gpu_debs: copied $copied cuDNN/NCCL headers into $stage/include"

size_kib="$(du -sk "$stage" | cut -f1)"
echo "stage_gpu_debs: $(find "$debs" -name '*.deb' | wc -l) packages, .stage is $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((48 * 1024)) ]; then
  echo "stage_gpu_debs: warning: .stage is over 48 MiB; the working tree sent to a GPU machine is limited to 64 MiB" >&2
fi
if ! git -C "$repo" check-ignore -q "$stage/debs/x.deb"; then
  echo "stage_gpu_debs: warning: .stage/ is not git-ignored; add '.stage/' to .gitignore" >&2
fi
echo "stage_gpu_debs: done. On the GPU machine: bash scripts/gpu_run.sh (carry .stage along)"
