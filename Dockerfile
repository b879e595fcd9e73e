# Build: docker build -t sluice .
# Run:   docker run -p 8080:8080 -v $PWD/gateway.toml:/etc/sluice/gateway.toml sluice
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin sluice

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 sluice
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
COPY gateway.toml /etc/sluice/gateway.toml
USER sluice
ENV SLUICE_CONFIG=/etc/sluice/gateway.toml
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["run", "--log-format", "json"]
