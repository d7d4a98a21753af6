# The skillopt image: this repository installed with pip, console script `skillopt`, Prefect included.
# docker-compose.yml runs it three ways: the Prefect server, the trainer (`skillopt serve`) and the
# static report server. Build by hand with: docker build -t skillopt:local .
# Optional extras (comma-separated, see pyproject.toml): docker build --build-arg EXTRAS=spreadsheetbench,dask .
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

# bubblewrap is the OS sandbox that model-written code and the exec targets' CLIs run in; without it
# spreadsheetbench, the fake SWE-bench harness and codex_exec/claude_code_exec refuse to run
# (docs/sandbox.md). In a container the engine must also allow user namespaces (Docker's default
# seccomp profile may not: docker run --security-opt seccomp=unconfined, or a userns-enabled host).
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/skillopt
# Only what the package is built from (see .dockerignore): the library, tasks, flows, deployments,
# and the prompts and configs that ship inside the wheel.
COPY pyproject.toml README.md ./
COPY skillopt ./skillopt
COPY tasks ./tasks
COPY flows ./flows
COPY deployments ./deployments
COPY prompts ./prompts
COPY configs ./configs
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && skillopt --version

# An unprivileged user; /data is the working directory of every service: runs/, .skillopt/cache,
# skills/ and the server's .prefect/ below it are the compose volumes (created here so new volumes get
# this user as owner).
RUN useradd --create-home --uid 1000 skillopt \
    && mkdir -p /data/runs /data/.skillopt/cache /data/skills /data/datasets /data/.prefect \
    && chown -R skillopt:skillopt /data
USER skillopt
WORKDIR /data

CMD ["skillopt", "serve"]
