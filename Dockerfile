# syntax=docker/dockerfile:1.7
#
# The etcd operator's two images, one build target each:
#
#   docker build --target controller -t etcd-operator/etcd-controller:0.1.0 .
#   docker build --target webhook    -t etcd-operator/etcd-webhook:0.1.0 .
#
# Both binaries are built once, in the same builder stage (BuildKit shares it between the two
# targets), with the release profile and the checked-in Cargo.lock. The runtime images are
# distroless (glibc, CA certificates, no shell) and run as the unprivileged user 65532.

ARG RUST_VERSION=1.95
# The builder must be Debian 12 (bookworm) like the runtime image: a binary linked against a
# newer glibc (the default rust image follows Debian's newest release) would not start there.
ARG BUILDER_IMAGE=rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER_IMAGE} AS builder
# etcd-client compiles etcd's protobuf definitions at build time (tonic-prost-build: protoc).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole workspace (see .dockerignore): cargo reads every member's manifest, even to build
# two of them.
COPY . .
# Registry, git and target caches survive between builds; the binaries are copied out of the
# cache mount in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p etcd-controller -p etcd-webhook \
    && mkdir -p /out \
    && cp target/release/etcd-controller target/release/etcd-webhook /out/

FROM ${RUNTIME_IMAGE} AS runtime-base
ARG VERSION=0.1.0
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532

FROM runtime-base AS webhook
LABEL org.opencontainers.image.title="etcd-webhook" \
      org.opencontainers.image.description="The EtcdCluster admission webhook (validation and defaulting)"
COPY --from=builder /out/etcd-webhook /usr/local/bin/etcd-webhook
# glibc's allocator: large buffers always mmapped (returned to the system when freed) and two
# arenas, so memory falls back after a burst of large reviews (webhook/benches/memory.rs).
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.arena_max=2
EXPOSE 9443 8080 8081
ENTRYPOINT ["/usr/local/bin/etcd-webhook"]

# Last, so a plain `docker build .` gives the controller.
FROM runtime-base AS controller
LABEL org.opencontainers.image.title="etcd-controller" \
      org.opencontainers.image.description="The etcd operator's controller"
COPY --from=builder /out/etcd-controller /usr/local/bin/etcd-controller
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/etcd-controller"]
