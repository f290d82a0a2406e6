# syntax=docker/dockerfile:1
# One image for the gateway, its engines and the load-test harness:
#   docker build -t slo-gateway .
#   docker run slo-gateway serve --config /etc/slo-gateway/config/gateway.toml
#   docker run slo-gateway engine --listen 0.0.0.0:9000 ...
# Multi-stage: the toolchain stays in the build stage; the runtime stage is
# a slim Debian with the binaries, the shipped policies and profiles, run as
# an unprivileged user. The cuda backend loads libcuda/NVRTC/cuBLAS at run
# time (cudarc, dynamic loading): on GPU nodes the NVIDIA container runtime
# mounts them; the same image runs the emulated and cpu backends anywhere.

FROM rust:1.85-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gateway -p loadtest \
 && mkdir -p /out \
 && cp target/release/gateway target/release/loadtest /out/

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 slo \
 && useradd --system --uid 10001 --gid slo --home-dir /nonexistent --shell /usr/sbin/nologin slo
COPY --from=build /out/gateway /out/loadtest /usr/local/bin/
COPY policies/default.toml /usr/share/slo-gateway/policies/default.toml
COPY policies/profiles /usr/share/slo-gateway/policies/profiles
COPY policies/oserve-lstm.json /usr/share/slo-gateway/policies/oserve-lstm.json
COPY loadtest/workloads /usr/share/slo-gateway/loadtest/workloads
WORKDIR /usr/share/slo-gateway
USER 10001:10001
EXPOSE 8443 9444 9000
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/gateway"]
CMD ["--help"]
