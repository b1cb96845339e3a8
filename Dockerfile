# syntax=docker/dockerfile:1
# eerld container image: build wheels in one stage, install them into a slim runtime in the next.
#   docker build -t eerld:0.1.0 .
#   docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all --cap-drop=ALL --cap-add=SYS_ADMIN \
#     -v /run/eerld:/run/eerld -v /var/lib/eerld:/var/lib/eerld eerld:0.1.0
#   docker build --build-arg EERL_SIM='eerl-sim[bench]' -t eerld-bench:0.1.0 .   # simulator and eerl-bench too
# The simulator (eerld --backend sim) and eerl-bench are the eerl-sim distribution (sim/): not in the default
# image; EERL_SIM=eerl-sim adds the simulator, EERL_SIM='eerl-sim[bench]' eerl-bench's plots too.
# The base is pinned to an exact release tag; pin its digest too (python:3.11.11-slim-bookworm@sha256:…)
# in your registry mirror for bit-for-bit reproducible builds. Every Python package is pinned by
# constraints.txt (the build backend included), which `make constraints` re-resolves: see CONTRIBUTING.md.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EERL_SIM=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY constraints.txt ./
# The build backend at its pinned version, so that the wheels build without an isolated, unpinned one.
RUN pip install --constraint constraints.txt hatchling
COPY client/ client/
COPY eerld/ eerld/
COPY eerlctl/ eerlctl/
COPY sim/ sim/
COPY pyproject.toml README.md ./
# Wheels for the client (generated gRPC code), the daemon, the simulator when asked for (scenarios included)
# and every dependency, each at its version in constraints.txt.
RUN sim=; if [ -n "$EERL_SIM" ]; then sim="./sim${EERL_SIM#eerl-sim}"; fi \
    && pip wheel --no-build-isolation --constraint constraints.txt --wheel-dir /wheels ./client . $sim \
    && ls /wheels

FROM ${PYTHON_IMAGE} AS runtime
ARG EERL_SIM=
# The distributions' version (pyproject.toml); `make image` passes it, and tags the image with it.
ARG EERL_VERSION=0.1.0
LABEL org.opencontainers.image.title="eerld" \
      org.opencontainers.image.version="${EERL_VERSION}" \
      org.opencontainers.image.description="Energy-efficient RL GPU clock-control daemon" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels eerld $EERL_SIM \
    && eerlctl --help >/dev/null \
    && if [ -n "$EERL_SIM" ]; then python -c "from eerl_sim.scenario import load_scenario; load_scenario('sync-h100')"; fi
# Root inside the container, but only with the capabilities the runtime grants (SYS_ADMIN for clock
# locks): NVML's clock calls need them, and nothing else is needed.
USER 0:0
VOLUME ["/run/eerld", "/var/lib/eerld"]
EXPOSE 9478
STOPSIGNAL SIGTERM
ENTRYPOINT ["eerld"]
CMD ["--backend=nvml", "--socket=/run/eerld/eerld.sock", "--admin-socket=/run/eerld/admin.sock", "--state-dir=/var/lib/eerld", "--metrics-address=0.0.0.0:9478"]
