# webhook-inbox as a container image. How to build, run and configure it:
# docs/guides/deploying.md. This file has not been built on the developers' machine, which has
# no Docker engine: build it once yourself before relying on it.
#
#   docker build -t webhook-inbox .
#   docker run -d --name webhook-inbox -p 8080:8080 -v webhook-inbox-data:/var/lib/webhook-inbox/data webhook-inbox

# Build stage: the official Rust image on Debian bookworm (the developers use rustc 1.95).
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Only what the release binary is built from: the manifest and lock file, the SQLite compile
# options in .cargo/config.toml, the code, and the files it embeds (migrations, ui/).
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY src src
COPY migrations migrations
COPY ui ui
RUN cargo build --release --locked

# Run stage: the same Debian release, slim. SQLite is compiled into the binary and TLS to a
# downstream uses rustls with built-in roots, so nothing else is installed.
FROM debian:bookworm-slim
# A fixed uid and gid (10001), so that a bind-mounted data directory can be given to it.
RUN groupadd --system --gid 10001 webhook-inbox \
    && useradd --system --uid 10001 --gid webhook-inbox --home-dir /var/lib/webhook-inbox --shell /usr/sbin/nologin webhook-inbox \
    && install -d -o webhook-inbox -g webhook-inbox -m 0750 /var/lib/webhook-inbox /var/lib/webhook-inbox/data
COPY --from=build /src/target/release/webhook-inbox /usr/local/bin/webhook-inbox

USER webhook-inbox
# The working directory holds data/: the SQLite database (sqlite://data/webhook-inbox.db), the
# generated admin token and, on the embedded default, the demo source's secret.
WORKDIR /var/lib/webhook-inbox
VOLUME ["/var/lib/webhook-inbox/data"]
# Listen on every interface of the container (the default, 127.0.0.1, is unreachable from
# outside it). This variable wins over `listen` in a config file.
ENV WEBHOOK_INBOX_LISTEN=0.0.0.0:8080
EXPOSE 8080
# SIGTERM (docker stop) shuts down gracefully; give it time: docker run --stop-timeout 30.
STOPSIGNAL SIGTERM
ENTRYPOINT ["webhook-inbox"]
CMD ["serve"]
