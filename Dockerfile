# syntax=docker/dockerfile:1
# The gpusizer operator image: `docker build -t ghcr.io/gpusizer/gpusizer:0.1.0 .`
# Build stage: a virtualenv with the pinned runtime dependencies and the package.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/gpusizer
WORKDIR /src
# Dependencies first, so a code change reuses this layer. Every version is pinned in the lock.
COPY requirements.lock ./
RUN /opt/gpusizer/bin/pip install --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/gpusizer/bin/pip install --no-deps . \
 && /opt/gpusizer/bin/pip check \
 && /opt/gpusizer/bin/gpusizer --help >/dev/null

# Runtime stage: the same small base, the virtualenv, and an unprivileged user.
FROM python:3.11-slim-bookworm
RUN useradd --uid 65532 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpusizer
COPY --from=build /opt/gpusizer /opt/gpusizer
ENV PATH=/opt/gpusizer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
# 8080: the operator's /metrics; 8081: /healthz for the probes.
EXPOSE 8080 8081
ENTRYPOINT ["gpusizer"]
CMD ["run"]
