#!/usr/bin/env bash
# Installs the Debian packages OasisKV's build and tests need. Idempotent: runs
# `apt-get update` at most once and installs only the packages that are missing.
# CUDA 13 is expected at /usr/local/cuda (optional: without it the build is CPU-only).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git curl ca-certificates
  clang clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libspdlog-dev catch2 libcpp-httplib-dev
  libpcre2-dev libutf8proc-dev libucx-dev libboost-dev iproute2 gnuplot-nox
  nodejs npm python3 python3-jinja2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    # Tools installed outside apt count as present when their binary exists.
    case "$p" in
      nodejs) command -v node >/dev/null && continue ;;
      npm) command -v npm >/dev/null && continue ;;
      python3) command -v python3 >/dev/null && continue ;;
      python3-jinja2) python3 -c 'import jinja2' 2>/dev/null && continue ;;
      cmake) command -v cmake >/dev/null && continue ;;
      clang) command -v clang++ >/dev/null && continue ;;
    esac
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present"
fi
