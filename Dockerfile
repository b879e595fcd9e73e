# Build: docker build --build-arg SLUICE_COMMIT=$(git rev-parse --short=12 HEAD) -t sluice .
# Run:   docker run -p 8080:8080 -p 9090:9090 -v sluice-state:/var/lib/sluice \
#          -v $PWD/gateway.toml:/etc/sluice/gateway.toml:ro sluice
#
# The image runs `sluice run --log-format json` as uid 10001 with
# examples/container/gateway.toml (tests/container.rs starts the binary the same way).

FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when Cargo.toml or Cargo.lock
# change, not on every source edit. Empty targets stand in for the sources.
COPY Cargo.toml Cargo.lock build.rs ./
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in limiter memory flash_sale; do echo 'fn main() {}' > benches/$b.rs; done \
    && cargo build --release --locked --bin sluice \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
# No .git in the build context (.dockerignore): the commit comes as a build argument.
ARG SLUICE_COMMIT=unknown
ENV SLUICE_COMMIT=${SLUICE_COMMIT}
# touch: the sources are older than the stand-ins cargo just built.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin sluice \
    && strip target/release/sluice

FROM debian:bookworm-slim
# CA certificates: https upstreams are verified against the system's roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
COPY examples/container/gateway.toml /etc/sluice/gateway.toml
# The state file (counters and bans across restarts) lives on a volume the
# unprivileged user can write.
RUN mkdir -p /var/lib/sluice && chown 10001:10001 /var/lib/sluice
VOLUME ["/var/lib/sluice"]
USER 10001:10001
ENV SLUICE_CONFIG=/etc/sluice/gateway.toml
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/sluice", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["run", "--log-format", "json"]
