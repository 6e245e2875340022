#!/usr/bin/env bash
# Packs built executables plus the non-system shared libraries they need (ldd) into
# .bundle/ (git-ignored), so the GPU machine can run binaries built here:
#   tools/make_bundle.sh build/tests/kernels/test_gpu_runtime build/tools/oasis-generate ...
# There: LD_LIBRARY_PATH=.bundle/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH .bundle/bin/<exe>
# CUDA's own libraries (cudart, cublas, nccl) and glibc are taken from the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.bundle
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for exe in "$@"; do
  cp "$exe" "$OUT/bin/"
  strip --strip-debug "$OUT/bin/$(basename "$exe")"
  ldd "$exe" | awk '/=> \// {print $3}' | while read -r lib; do
    base=$(basename "$lib")
    case "$base" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*|libnccl*|libnvidia*) ;;
      *) cp -n "$lib" "$OUT/lib/" ;;
    esac
  done
done
# The GPU machine's libstdc++ (gcc 13) is newer than ours, so it is used from there.
du -sh "$OUT"
