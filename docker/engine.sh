#!/usr/bin/env bash
# Start (or reuse) a private Docker engine for building and testing the app image.
#
# These machines ship only the docker client. This script installs the engine
# (Debian's docker.io) and debootstrap (used by base-image.sh) when missing, and
# runs dockerd with everything under $AAGC_DOCKER_DIR (default /tmp/aagc-docker):
# its data root, exec root, pid file and socket. There is no bridge network and
# no iptables, so images are built and run with `--network host`.
#
# Source it to get DOCKER_HOST in your shell:   source docker/engine.sh
# or run it and export the printed DOCKER_HOST yourself.
# Idempotent: a running engine on the same socket is reused.
set -euo pipefail

AAGC_DOCKER_DIR="${AAGC_DOCKER_DIR:-/tmp/aagc-docker}"
sock="$AAGC_DOCKER_DIR/docker.sock"
export DOCKER_HOST="unix://$sock"

# Install the engine and debootstrap only if they are not there yet.
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "engine.sh: installing docker.io and debootstrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    nice -n 19 apt-get update -qq
    nice -n 19 apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
fi

# Reuse an engine that already answers on our socket.
if docker info >/dev/null 2>&1; then
    echo "engine.sh: reusing the engine at $DOCKER_HOST" >&2
else
    mkdir -p "$AAGC_DOCKER_DIR/data" "$AAGC_DOCKER_DIR/exec"
    # A stale socket or pid file from a killed engine would stop dockerd from starting.
    rm -f "$sock" "$AAGC_DOCKER_DIR/dockerd.pid"
    echo "engine.sh: starting dockerd (log: $AAGC_DOCKER_DIR/dockerd.log)" >&2
    # overlay2 builds the image in about a minute; vfs copies every layer and is several times slower.
    # setsid + nohup: the engine outlives this script (and the shell that sourced it).
    setsid nohup dockerd \
        --storage-driver=overlay2 \
        --iptables=false --ip6tables=false --bridge=none \
        --data-root "$AAGC_DOCKER_DIR/data" \
        --exec-root "$AAGC_DOCKER_DIR/exec" \
        --pidfile "$AAGC_DOCKER_DIR/dockerd.pid" \
        -H "$DOCKER_HOST" \
        >"$AAGC_DOCKER_DIR/dockerd.log" 2>&1 </dev/null &
    # Wait (up to 60 s) until the engine answers.
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    if ! docker info >/dev/null 2>&1; then
        echo "engine.sh: dockerd did not come up; last lines of its log:" >&2
        tail -n 20 "$AAGC_DOCKER_DIR/dockerd.log" >&2 || true
        exit 1
    fi
fi

echo "export DOCKER_HOST=$DOCKER_HOST"
