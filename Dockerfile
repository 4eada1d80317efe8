# records-gateway container image: slim Python, non-root, tini as PID 1, health-checked.
#
# The build stage makes the project's wheel and installs it into a virtual environment;
# the runtime stage copies only that environment onto the same base image (the venv's
# interpreter is the base image's, so both stages must match). Every Python package comes
# from the lock files in requirements/ with pip's --require-hashes (docs/install.md, "Upgrading
# dependencies"): the image has the versions `make run` installs, whenever it is built.
#
#   docker build -t records-gateway .
#   buildah bud --format docker -t records-gateway .     # or: podman build --format docker
#   docker run --rm -p 127.0.0.1:8080:8080 \
#     -e GATEWAY_UPSTREAM__BASE_URL=https://records.example.com \
#     -e GATEWAY_CACHE__REDIS_URL=redis://redis.internal:6379/0 \
#     -e GATEWAY_CACHE__KEY_SECRET=... records-gateway
#
# buildah and podman write the OCI image format unless told otherwise, and that format has
# no HEALTHCHECK: without --format docker the image is built with no health check (they
# warn "HEALTHCHECK is not supported for OCI image format and will be ignored").
#
# The baked-in config is deploy/config.redis.toml (cache.backend = "redis", no key_secret):
# without GATEWAY_CACHE__KEY_SECRET the gateway exits 2 naming cache.key_secret. Mount
# your own file at /etc/records-gateway/config.toml, or set GATEWAY_* variables.
#
# Debian packages are pinned to bookworm's versions, in build arguments. Debian replaces
# a released package only in a point release or a security update, and its archive then
# offers the new version instead: a build that stops at "Version '...' for '...' was not
# found" needs the new one (deploy/README.md, "Build the image"). libc6-dev is the
# exception: it must be the very version of the base image's libc6, which moves with
# Debian's security updates, so a pin (written here or read from the image) would fail
# whenever the archive moved past it. apt installs the current one and, where the image
# is behind, the libc6 that goes with it, in the build stage only; both are glibc 2.36
# for bookworm's whole life, so the compiled module runs on the runtime stage's libc6.
#
# The base image is named by tag, so that a build picks up Debian's security updates and
# Python's patch releases; for the same image on every build, add its digest:
#   --build-arg PYTHON_IMAGE=python:3.13-slim-bookworm@sha256:...

ARG PYTHON_IMAGE=python:3.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG GCC_VERSION=4:12.2.0-3
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# gcc builds gateway/normalise/compiled.pyx (Cython, from requirements/build.txt); only the
# build stage has it, the runtime stage gets the compiled module in the venv. libc6-dev
# is not pinned (above).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc="${GCC_VERSION}" libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# the dependencies before the source, so that a change to the code alone reuses this layer
COPY requirements/build.txt requirements/run.txt ./requirements/
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --require-hashes -r requirements/build.txt \
    && python -m venv /opt/records-gateway \
    && /opt/records-gateway/bin/pip install --require-hashes -r requirements/run.txt
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
# the wheel is built with the locked setuptools and Cython (no build isolation, which
# would fetch whatever releases are newest) and installed without dependencies: they
# are all in the venv already, at the versions of the lock
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/records-gateway/bin/pip install --no-deps /wheels/records_gateway-*.whl \
    && /opt/records-gateway/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
ARG TINI_VERSION=0.19.0-1+b3
# tini is PID 1: it forwards SIGTERM, SIGINT and SIGHUP to the gateway (whose main
# process forwards them to its workers when server.workers > 1), reaps any orphaned
# worker, and lets `docker stop` work even before the gateway has installed its own
# signal handlers (PID 1 ignores signals it has no handler for). TINI_SUBREAPER keeps
# the reaping when another init is PID 1 (`docker run --init`).
RUN apt-get update \
    && apt-get install --yes --no-install-recommends tini="${TINI_VERSION}" \
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
