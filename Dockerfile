# The mmgate gateway's image: `mmgate serve`, configured by MMGATE_* variables (every flag has one,
# see `mmgate serve --help-all`), as a non-root user, draining requests in flight on SIGTERM.
#
#   docker build -t mmgate .                                   # deps from the package index
#   tools/wheelhouse.sh && docker build --build-arg PIP_OFFLINE=1 -t mmgate .   # deps from wheels only
#
# BASE_IMAGE must provide python3 (3.11+) with its venv module; docs/DEPLOY.md shows a base image built
# from Debian's packages for machines that reach no container registry.
ARG BASE_IMAGE=python:3.11-slim

# Build stage: a virtual environment holding mmgate (built from this checkout) with its runtime
# dependencies and the otel extra (OpenTelemetry's SDK and OTLP exporter, which
# MMGATE_OTLP_TRACES_ENDPOINT needs; loaded only when it is set), installed from the wheelhouse
# (deploy/docker/wheelhouse) and, unless PIP_OFFLINE=1, the package index. Nothing of this stage but the environment reaches the image.
FROM ${BASE_IMAGE} AS build
# Marks what this stage leaves in docker's store: `docker image prune --filter label=mmgate.stage=build`.
LABEL mmgate.stage=build
ARG PIP_OFFLINE=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
COPY deploy/docker/wheelhouse/ /wheelhouse/
COPY pyproject.toml README.md /src/
COPY src/ /src/src/
RUN python3 -m venv /opt/mmgate \
 && if [ "$PIP_OFFLINE" = "1" ]; then index="--no-index"; else index=""; fi \
 && /opt/mmgate/bin/pip install --quiet $index --find-links /wheelhouse "/src[otel]" \
 && /opt/mmgate/bin/pip uninstall --quiet --yes pip setuptools \
 && /opt/mmgate/bin/python -c 'import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter' \
 && /opt/mmgate/bin/mmgate serve --help >/dev/null

# Run stage: the base image and the environment, nothing else (no compiler, no pip, no sources).
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="mmgate" \
      org.opencontainers.image.description="Multimodal-aware gateway for OpenAI-compatible LLM serving" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/mmgate /opt/mmgate
# MMGATE_HOST: listen on every interface of the container (the gateway's own default is loopback).
ENV PATH=/opt/mmgate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MMGATE_HOST=0.0.0.0 \
    MMGATE_PORT=8000
# A numeric uid and gid (no passwd entry needed): Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 8000
# /health answers 200 while at least one backend passes its health checks; no curl here, so Python.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('MMGATE_PORT', '8000'), timeout=2)"]
# SIGTERM: stop accepting, let requests in flight finish for MMGATE_DRAIN_TIMEOUT seconds, exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["mmgate", "serve"]
