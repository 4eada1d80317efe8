# records-gateway container image: slim Python, non-root, health-checked.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home gateway \
    && mkdir -p /etc/records-gateway
COPY --from=build /install /usr/local
COPY config.example.toml /etc/records-gateway/config.toml
ENV PYTHONUNBUFFERED=1 \
    GATEWAY_SERVER__HOST=0.0.0.0
USER gateway
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
STOPSIGNAL SIGTERM
CMD ["records-gateway", "serve", "--config", "/etc/records-gateway/config.toml"]
