#!/usr/bin/env bash
# `make docker-test`: build the app image, run it, check its health and take a screenshot.
#
#   1. start (or reuse) a private Docker engine (engine.sh) and make the base image if
#      the engine lacks it (base-image.sh; on a normal machine Docker Hub's is used);
#   2. fetch the CPU torch wheel that the host's pip resolves for requirements.txt's pin and
#      serve it to the build from a loopback HTTP server (find-links);
#   3. `docker build --network host -t aagc-app .` (timed);
#   4. run the image with --network host on a free port, wait for /_stcore/health to answer
#      "ok" and for Docker's own HEALTHCHECK to report "healthy";
#   5. screenshot the running app with headless Chromium into out/docker-screenshot.png (no Deploy button).
# The container and the wheel server are removed on exit, whatever happens; any failure
# exits non-zero. Tunables (environment): IMAGE, APP_PORT, WHEELS_PORT, HEALTH_TIMEOUT,
# SHOT_TRIES, SHOT_WAIT_FOR.
set -euo pipefail

cd "$(dirname "$0")/.."
repo="$(pwd)"
IMAGE="${IMAGE:-aagc-app}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-180}"   # seconds for the app, then again for the HEALTHCHECK
out="$repo/out"
wheels="$out/docker-wheels"
screenshot="$out/docker-screenshot.png"
container="aagc-app-test-$$"
started=$(date +%s)

say() { echo "docker-test: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

# Is a TCP port on 127.0.0.1 free?
port_free() {
    python3 -c "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); sys.exit(s.connect_ex(('127.0.0.1', int(sys.argv[1]))) == 0)" "$1"
}
# The wanted port if free, otherwise one the kernel picks.
pick_port() {
    if port_free "$1"; then echo "$1"; else
        python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    fi
}

server_pid=""
cleanup() {
    local rc=$?
    if docker container inspect "$container" >/dev/null 2>&1; then
        if [ "$rc" -ne 0 ]; then
            say "container log (last 40 lines):"
            docker logs --tail 40 "$container" >&2 2>&1 || true
        fi
        docker rm -f "$container" >/dev/null 2>&1 || true
    fi
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
    say "total $(( $(date +%s) - started )) s, exit $rc"
}
trap cleanup EXIT

# 1. Engine and base image. engine.sh exports DOCKER_HOST when sourced.
# shellcheck source=docker/engine.sh
source "$repo/docker/engine.sh" >/dev/null
bash "$repo/docker/base-image.sh"

# The app needs Streamlit in requirements.txt and its entry point.
grep -qiE '^streamlit([=<>~! ]|$)' requirements.txt || fail "requirements.txt does not list streamlit"
[ -f app/main.py ] || fail "app/main.py does not exist (the image would have no app to start)"
ls checkpoints/*.safetensors >/dev/null 2>&1 || say "warning: no checkpoints/*.safetensors; the image ships none"

# 2. The torch wheel. requirements.txt pins torch==X; the host's pip resolves that pin through its
# own configuration (here: find-links with the CPU build). Only a "+cpu" build is accepted.
torch_pin="$(grep -E '^torch==' requirements.txt | head -n 1 | tr -d '[:space:]')"
[ -n "$torch_pin" ] || fail "no torch==... pin in requirements.txt"
mkdir -p "$wheels"
say "fetching $torch_pin (cp311) into $wheels"
nice -n 19 python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    -d "$wheels" "$torch_pin" || fail "pip could not download $torch_pin"
version="${torch_pin#torch==}"
ls "$wheels"/torch-"$version"+cpu-cp311-*.whl >/dev/null 2>&1 \
    || fail "pip resolved $torch_pin to $(ls "$wheels") - not a CPU (+cpu) cp311 wheel"
# Keep only that wheel, so the loopback index offers nothing else.
find "$wheels" -type f ! -name "torch-$version+cpu-cp311-*.whl" -delete

# A loopback find-links server for the build (RUN steps share the host network).
# A fixed port keeps the build argument, and so Docker's layer cache, stable between runs.
wheels_port="$(pick_port "${WHEELS_PORT:-8765}")"
python3 -m http.server "$wheels_port" --bind 127.0.0.1 --directory "$wheels" >/dev/null 2>&1 &
server_pid=$!
for _ in $(seq 20); do port_free "$wheels_port" || break; sleep 0.25; done
port_free "$wheels_port" && fail "the wheel server did not start on port $wheels_port"

# 3. Build. TORCH_INDEX_URL is emptied: PyTorch's index is unreachable here, the wheel server has the build.
say "building $IMAGE"
build_start=$(date +%s)
nice -n 19 docker build --network host \
    --build-arg TORCH_INDEX_URL= \
    --build-arg WHEELS_URL="http://127.0.0.1:$wheels_port/" \
    -t "$IMAGE" . || fail "docker build"
build_s=$(( $(date +%s) - build_start ))
kill "$server_pid" 2>/dev/null || true
server_pid=""
size_mb=$(( $(docker image inspect --format '{{.Size}}' "$IMAGE") / 1000000 ))
say "built $IMAGE in $build_s s; image size $size_mb MB"

# 4. Run on 8501, or a free port if something else holds it; the image's health check follows
# STREAMLIT_SERVER_PORT. -p does nothing without a bridge network, hence --network host.
port="$(pick_port "${APP_PORT:-8501}")"
url="http://127.0.0.1:$port"
say "starting $container on $url"
docker run -d --network host --name "$container" -e STREAMLIT_SERVER_PORT="$port" "$IMAGE" >/dev/null

running() { [ "$(docker inspect --format '{{.State.Running}}' "$container" 2>/dev/null)" = "true" ]; }

run_start=$(date +%s)
deadline=$(( run_start + HEALTH_TIMEOUT ))
until [ "$(curl -fsS --max-time 3 "$url/_stcore/health" 2>/dev/null)" = "ok" ]; do
    running || fail "the container stopped before answering"
    [ "$(date +%s)" -lt "$deadline" ] || fail "$url/_stcore/health did not answer ok within $HEALTH_TIMEOUT s"
    sleep 1
done
say "$url/_stcore/health answered ok after $(( $(date +%s) - run_start )) s"

# Docker's HEALTHCHECK runs every 15 s inside the container; wait for its verdict.
deadline=$(( $(date +%s) + HEALTH_TIMEOUT ))
while :; do
    health="$(docker inspect --format '{{.State.Health.Status}}' "$container")"
    [ "$health" = "healthy" ] && break
    [ "$health" = "unhealthy" ] && fail "HEALTHCHECK says unhealthy"
    running || fail "the container stopped"
    [ "$(date +%s)" -lt "$deadline" ] || fail "HEALTHCHECK still '$health' after $HEALTH_TIMEOUT s"
    sleep 2
done
say "HEALTHCHECK: $health"
docker exec "$container" id -u | grep -qx 0 && fail "the app runs as root"

# 5. Screenshot with headless Chromium (Debian's; installed if missing).
if [ ! -x /usr/bin/chromium ]; then
    say "installing chromium"
    DEBIAN_FRONTEND=noninteractive nice -n 19 apt-get install -y -qq chromium >/dev/null
fi
mkdir -p "$out"
dom="$out/docker-screenshot.html"
# A plain `chromium --screenshot` races Streamlit: virtual time runs out while the script is still
# running over its websocket, giving a blank or half-drawn page. So each try also dumps the DOM it
# captured, and we retry (later tries find the app's caches warm) until the DOM shows the script
# finished (no status widget, no loading skeleton), drew elements and, if SHOT_WAIT_FOR is set,
# contains that extended regular expression. An exception drawn by the app fails the test.
shot_ok=""
for try in $(seq "${SHOT_TRIES:-10}"); do
    rm -f "$screenshot" "$dom"
    profile="$(mktemp -d /tmp/aagc-chromium.XXXXXX)"
    timeout 120 /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$profile" --window-size=1400,1400 --virtual-time-budget=15000 \
        --run-all-compositor-stages-before-draw \
        --screenshot="$screenshot" --dump-dom "$url/" >"$dom" 2>/dev/null || true
    rm -rf "$profile"
    running || fail "the container stopped while the page was open"
    grep -q 'data-testid="stException"' "$dom" && fail "the app shows an exception (see $dom)"
    if [ -s "$screenshot" ] && grep -q 'data-testid="stElementContainer"' "$dom" \
        && ! grep -qE 'data-testid="(stStatusWidget|stAppSkeleton)"' "$dom" \
        && grep -qE "${SHOT_WAIT_FOR:-.}" "$dom"; then
        shot_ok=1
        break
    fi
    say "screenshot try $try: page not finished drawing yet"
    sleep 3
done
[ -n "$shot_ok" ] || fail "no fully drawn page after ${SHOT_TRIES:-10} tries (last DOM: $dom)"
say "screenshot: $screenshot ($(( $(stat -c %s "$screenshot") / 1000 )) kB, try $try)"
# Viewers get no Deploy button (client.toolbarMode = "viewer", in .streamlit/config.toml and the image's env).
grep -q 'stAppDeployButton' "$dom" && fail "the page shows Streamlit's Deploy button (see $dom)"

say "OK: build $build_s s, image $size_mb MB, health ok, HEALTHCHECK $health"
