# records-gateway container image: slim Python, non-root, tini as PID 1, health-checked.
#
# The build stage makes the project's wheel and installs it with its dependencies into
# a virtual environment; the runtime stage copies only that environment onto the same
# base image (the venv's interpreter is the base image's, so both stages must match).
#
#   docker build -t records-gateway .
#   docker run --rm -p 127.0.0.1:8080:8080 \
#     -e GATEWAY_UPSTREAM__BASE_URL=https://records.example.com \
#     -e GATEWAY_CACHE__REDIS_URL=redis://redis.internal:6379/0 \
#     -e GATEWAY_CACHE__KEY_SECRET=... records-gateway
#
# The baked-in config is deploy/config.redis.toml (cache.backend = "redis", no key_secret):
# without GATEWAY_CACHE__KEY_SECRET the gateway exits 2 naming cache.key_secret. Mount
# your own file at /etc/records-gateway/config.toml, or set GATEWAY_* variables.

ARG PYTHON_IMAGE=python:3.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# gcc builds gateway/normalise/compiled.pyx (Cython, fetched by pip as a build requirement);
# only the build stage has it, the runtime stage gets the compiled module in the venv.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/records-gateway \
    && /opt/records-gateway/bin/pip install /wheels/records_gateway-*.whl \
    && /opt/records-gateway/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
# tini is PID 1: it forwards SIGTERM, SIGINT and SIGHUP to the gateway (whose main
# process forwards them to its workers when server.workers > 1), reaps any orphaned
# worker, and lets `docker stop` work even before the gateway has installed its own
# signal handlers (PID 1 ignores signals it has no handler for). TINI_SUBREAPER keeps
# the reaping when another init is PID 1 (`docker run --init`).
RUN apt-get update \
    && apt-get install --yes --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid gateway --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin gateway
COPY --from=build /opt/records-gateway /opt/records-gateway
COPY deploy/config.redis.toml /etc/records-gateway/config.toml
ENV PATH=/opt/records-gateway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TINI_SUBREAPER=1 \
    GATEWAY_SERVER__HOST=0.0.0.0
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
# Liveness only (/readyz is for load balancers). It follows GATEWAY_SERVER__PORT; a port
# set in a mounted config file instead needs the same value in that variable.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_SERVER__PORT', '8080'), timeout=2)"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["records-gateway", "serve", "--config", "/etc/records-gateway/config.toml"]
