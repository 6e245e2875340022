# OasisKV server image: build with CUDA 13 (devel), run on the CUDA runtime image.
#   docker build -t oasiskv .
#   docker run --gpus all -p 8000:8000 -v /models:/models oasiskv --model /models/Qwen3-8B
# Arguments after the image name go to oasis-server (see docs/server.md). With no arguments
# the container serves the embedded tiny model. Disaggregated serving (docs/disaggregation.md):
# the same image with --role prefill / --role decode, and the router with
#   docker run -p 8000:8000 --entrypoint /opt/oasiskv/bin/oasis-router oasiskv --host 0.0.0.0 \
#     --prefill prefill-host:8000 --decode decode-host:8000 The build steps are the README's:
# tools/install_deps.sh, then CMake + Ninja.
ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Debian/Ubuntu packages (the same list as on the dev machines), then the build.
COPY tools/install_deps.sh tools/install_deps.sh
RUN ./tools/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DOASIS_CUDA=ON -DOASIS_BUILD_TESTS=OFF \
 && cmake --build build --target oasis-server oasis-router \
 && mkdir -p /out/bin /out/lib /out/share/oasiskv \
 && cp build/src/server/oasis-server build/src/router/oasis-router /out/bin/ \
 && cp -r models/embedded /out/share/oasiskv/embedded \
 && cp -r models/embedded-eagle3 /out/share/oasiskv/embedded-eagle3 \
 && cp -r configs /out/share/oasiskv/configs \
 && ldd build/src/server/oasis-server | awk '/=> \// {print $3}' \
    | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux|libcuda|libcudart|libcublas|libcublasLt|libucp|libuct|libucs|libucm)[.-]' \
    | xargs -r -I{} cp -L {} /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
# UCX (disaggregation's transport) loads its transports as plugins from its own directory,
# which an ldd-based copy does not see: the runtime stage installs the package instead.
RUN apt-get update && apt-get install -y --no-install-recommends libucx0 && rm -rf /var/lib/apt/lists/*
# cuBLAS ships in the runtime image; the gRPC/protobuf/httplib/spdlog libraries come from /out/lib.
COPY --from=build /out/ /opt/oasiskv/
ENV LD_LIBRARY_PATH=/opt/oasiskv/lib:${LD_LIBRARY_PATH} \
    OASIS_EMBEDDED_MODEL=/opt/oasiskv/share/oasiskv/embedded
EXPOSE 8000 50051
ENTRYPOINT ["/opt/oasiskv/bin/oasis-server", "--host", "0.0.0.0"]
