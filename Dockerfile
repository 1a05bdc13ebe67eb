# syntax=docker/dockerfile:1
# The gpusizer operator image: `docker build -t ghcr.io/gpusizer/gpusizer:0.1.0 .`
# BASE is any Debian 12 image with Python 3.11 (`python3` and its venv module): the official
# python:3.11-slim-bookworm by default; `make image` passes a base made locally by debootstrap.
ARG BASE=python:3.11-slim-bookworm

# Build stage: a virtualenv with the pinned runtime dependencies and the package.
FROM ${BASE} AS build
# Where pip finds the wheels: PyPI unless these are passed (`make image` builds offline from
# a wheelhouse it downloaded and mounts: PIP_NO_INDEX=1, PIP_FIND_LINKS=/wheels).
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/gpusizer
WORKDIR /src
# Dependencies first, so a code change reuses this layer. Every version is pinned in the lock.
COPY requirements.lock ./
RUN /opt/gpusizer/bin/pip install --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY operator ./operator
# pip and setuptools leave the runtime: the image holds the lock's packages and gpusizer only.
RUN /opt/gpusizer/bin/pip install --no-deps . \
 && /opt/gpusizer/bin/pip check \
 && /opt/gpusizer/bin/gpusizer --help >/dev/null \
 && /opt/gpusizer/bin/pip uninstall --yes --quiet pip setuptools

# Runtime stage: the same base, the virtualenv, and an unprivileged user.
FROM ${BASE}
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
