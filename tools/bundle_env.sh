# Sourced by the GPU machine's scripts (gpu_suite.sh, gpu_server_smoke.sh, gpu_soak.sh), from
# the repository root: unpacks the carried bundle and test tokenizers (tools/gpu_suite.sh
# --bundle) where not unpacked yet, and puts the bundle's libraries and CUDA's on the path
# (CUDA_LIB is left set).
if [[ ! -d .bundle && -f .bundle-pack/bundle.tar.xz ]]; then
  python3 -c "import tarfile; tarfile.open('.bundle-pack/bundle.tar.xz').extractall()"
fi
if [[ ! -d .cache/test-data && -f .bundle-pack/tok.tar.xz ]]; then
  python3 -c "import tarfile; tarfile.open('.bundle-pack/tok.tar.xz').extractall()"
fi
CUDA_LIB=$(dirname "$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libcublas.so.* 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PWD/.bundle/lib:${CUDA_LIB}:${LD_LIBRARY_PATH:-}"
# The test binaries were built in another checkout: their committed fixtures, models/embedded
# and the test tokenizers are read from this one (tests/support/test_support.cpp, SourceDir).
export OASIS_SOURCE_DIR=$PWD
if [[ -d .cache/test-data ]]; then
  export OASIS_TEST_CACHE=${OASIS_TEST_CACHE:-$PWD/.cache/test-data}
fi
