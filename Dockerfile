# The attention-map web app: Streamlit on port 8501, CPU-only PyTorch, the shipped checkpoints.
#
#   docker build -t aagc-app .
#   docker run --rm -p 8501:8501 aagc-app        # then open http://localhost:8501
#
# On machines without a registry or a bridge network, `make docker-test` (docker/test.sh)
# makes a local base image, hands the CPU torch wheel to the build and runs it with --network host.
FROM python:3.11-slim

# CPU-only torch. requirements.txt pins torch==2.13.0; with PyTorch's CPU index as an extra
# index that pin resolves to 2.13.0+cpu (a local version sorts above the plain one), so the
# CUDA wheels of PyPI's build never come in. WHEELS_URL optionally adds a find-links location
# (docker/test.sh serves a host's wheel over loopback); leave TORCH_INDEX_URL empty where that
# index is unreachable and the wheel comes from WHEELS_URL instead.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG WHEELS_URL=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# Dependencies first, so that code changes reuse this layer. requirements.txt is read here,
# at build time: whatever it pins (streamlit, plotly, ...) is what the image gets.
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        ${WHEELS_URL:+--find-links "$WHEELS_URL"} \
        -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python -c "import torch, sys; sys.exit('CUDA torch %s installed' % torch.__version__ if torch.version.cuda else 0)"

# Run as an unprivileged user; the code is root-owned and read-only to it.
RUN groupadd --gid 10001 app \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin app
WORKDIR /srv/aagc
# .dockerignore lets only requirements.txt, models/, app/, checkpoints/ and .streamlit/ into the context.
COPY . .
# Numeric, so that `docker run --user`/Kubernetes runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
# What the first visitor would otherwise wait for (every shipped model's padding borders), computed now and kept
# in the app user's cache, where the app reads it.
ENV AAGC_CACHE=/home/app/.cache/aagc
RUN python -m app.warm

# Streamlit reads STREAMLIT_<SECTION>_<OPTION>; the port is an environment variable rather than a
# flag so that `docker run -e STREAMLIT_SERVER_PORT=...` moves the app and its health check together.
# The toolbar mode and error details are also in .streamlit/config.toml (read from the working directory):
# viewers get no "Deploy" button, developer menu or traceback, even if the image is run from another directory.
ENV STREAMLIT_SERVER_PORT=8501 \
    STREAMLIT_BROWSER_GATHER_USAGE_STATS=false \
    STREAMLIT_CLIENT_TOOLBAR_MODE=viewer \
    STREAMLIT_CLIENT_SHOW_ERROR_DETAILS=none \
    MPLCONFIGDIR=/tmp/matplotlib
EXPOSE 8501

# slim has no curl: ask Streamlit's health endpoint with urllib; it answers "ok".
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request as u; r = u.urlopen('http://localhost:%s/_stcore/health' % os.environ.get('STREAMLIT_SERVER_PORT', '8501'), timeout=4); sys.exit(r.read().strip() != b'ok')"]

# app/server.py prepares the default page before the server answers (its health check included).
CMD ["streamlit", "run", "app/server.py", "--server.address", "0.0.0.0", "--server.headless", "true"]
