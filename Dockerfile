# syntax=docker/dockerfile:1.7
# One image for every Crater service: `crater run <service>` (the default command runs the
# gateway). Built in two stages: uv installs the locked workspace into /opt/crater, and the
# runtime stage copies only that environment onto a slim Python, running as a non-root user.
#
#   docker build -t crater:dev .
#   docker run --rm crater:dev run scheduler          # any of: probe predictor scheduler
#                                                     # autoscaler callback gateway
#   docker run --rm crater:dev db upgrade             # any other `crater` command
#
# Not built in the session that wrote it: no container engine could run there (docs/deploy.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.9

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/crater
WORKDIR /src
# The locked dependencies and the workspace, installed non-editable (the runtime needs no
# /src); the dev group (tests, linters) stays out. EXTRAS: optional extras, comma-separated,
# e.g. `--build-arg EXTRAS=cuda` for a probe that measures its cards' PCIe links
# (CRATER_PROBE_MEASURE_PCIE_BANDWIDTH: NVIDIA's cuda-bindings; the driver's libcuda comes
# from the host through the NVIDIA container toolkit).
ARG EXTRAS=""
COPY pyproject.toml uv.lock ./
COPY libs libs
COPY services services
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable \
      ${EXTRAS:+$(printf -- '--extra %s ' $(echo "$EXTRAS" | tr ',' ' '))}

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="crater" \
      org.opencontainers.image.description="Crater: an event-driven GPU scheduler (every service)"
RUN groupadd --system --gid 10001 crater \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/crater --create-home \
      --shell /usr/sbin/nologin crater \
 && install -d -o 10001 -g 10001 /var/lib/crater/receiver /var/lib/crater/probe
COPY --from=build /opt/crater /opt/crater
COPY deploy/docker/entrypoint.sh /usr/local/bin/crater-entrypoint
ENV PATH=/opt/crater/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CRATER_HTTP_HOST=0.0.0.0
WORKDIR /var/lib/crater
USER 10001:10001
# Health and metrics (and the gateway's API): gateway 8080, probe 9101, predictor 9102,
# scheduler 9103, autoscaler 9104, callback 9105.
EXPOSE 8080 9101 9102 9103 9104 9105
ENTRYPOINT ["crater-entrypoint"]
CMD ["run", "gateway"]
