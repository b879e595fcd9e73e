# Build: docker build --build-arg SLUICE_COMMIT=$(git rev-parse --short=12 HEAD) -t sluice .
# Run:   docker run -p 8080:8080 -p 9090:9090 -v sluice-state:/var/lib/sluice \
#          -v $PWD/gateway.toml:/etc/sluice/gateway.toml:ro sluice
#
# The image runs `sluice run --log-format json` as uid 10001 with
# examples/container/gateway.toml (tests/cli/container.rs starts the binary the same way).

# The toolchain is pinned to the one scripts/release is checked with; a newer one is
# taken by changing this line and running scripts/release once by hand.
FROM rust:1.95-bookworm AS build
# The shipped build is scripts/release's: the dist profile compiled with a profile
# of sluice's own hot paths (PGO), then laid out by BOLT from another, both trained on
# loopback during the build. Its tools, all Debian packages: llvm-bolt and merge-fdata
# (bolt-19), llvm-profdata and llvm-strip (llvm-19; GNU strip breaks a binary BOLT has
# laid out: it segfaults at start), the load generators wrk and h2load, openssl for
# the training certificate, curl.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        bolt-19 llvm-19 wrk nghttp2-client openssl curl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, in their own layer: rebuilt only when Cargo.toml, Cargo.lock or
# the script change, not on every source edit. Empty targets stand in for the sources
# (one for every [[bench]] of Cargo.toml, which cargo requires to exist); the script's
# build compiles the dependencies with its flags.
COPY Cargo.toml Cargo.lock build.rs ./
COPY scripts/release ./scripts/release
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in $(awk '/^\[\[bench\]\]/ { b = 1 } b && $1 == "name" { gsub(/"/, "", $3); print $3; b = 0 }' Cargo.toml); \
        do echo 'fn main() {}' > benches/$b.rs; done \
    && scripts/release --prebuild \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
# No .git in the build context (.dockerignore): the commit comes as a build argument.
ARG SLUICE_COMMIT=unknown
ENV SLUICE_COMMIT=${SLUICE_COMMIT}
# touch: the sources are older than the stand-ins cargo just built. The script builds
# an instrumented binary, trains it on loopback (a proxied request, a 429, TLS, h2c),
# builds again with that profile (the dependencies too: the layer above holds the
# instrumented ones), has BOLT instrument the result, trains it again, lays it out
# into target/shipped/sluice and checks that binary (docs/performance.md, "The
# shipped build").
RUN touch src/main.rs src/lib.rs \
    && scripts/release \
    && llvm-strip-19 target/shipped/sluice

FROM debian:bookworm-slim
# CA certificates: https upstreams are verified against the system's roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/shipped/sluice /usr/local/bin/sluice
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
