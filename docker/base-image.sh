#!/usr/bin/env bash
# Make a local stand-in for the Dockerfile's base image `python:3.11-slim`.
#
# On a normal machine none of this is needed: `docker build` pulls the real
# python:3.11-slim from Docker Hub. Here no image registry is reachable, so we
# build a Debian bookworm root file system (bookworm's python3 is 3.11) with
# debootstrap and import it under the same name. Differences from the real image
# that matter for the build:
#   - Debian marks its python as externally managed; we remove that marker so
#     `pip install` works system-wide, as in the real image;
#   - `python` and `pip` are linked into /usr/local/bin, where the real image has them;
#   - package downloads here go through a proxy with its own CA, so the host's CA
#     bundle is copied in and PIP_CERT points pip at it.
#
# Needs DOCKER_HOST pointing at a running engine (see engine.sh) and root.
# Does nothing if the engine already has python:3.11-slim.
set -euo pipefail

image="${BASE_IMAGE:-python:3.11-slim}"
host_ca="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "base-image.sh: $image is already in the engine" >&2
    exit 0
fi

root="$(mktemp -d /tmp/aagc-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT

echo "base-image.sh: debootstrapping bookworm into $root (a few minutes)" >&2
nice -n 19 debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$root" >"$root.log" 2>&1 || { tail -n 30 "$root.log" >&2; exit 1; }
rm -f "$root.log"

# pip refuses system-wide installs while this marker exists (PEP 668).
rm -f "$root"/usr/lib/python3.11/EXTERNALLY-MANAGED
# The real image has python/pip in /usr/local/bin.
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/python3 "$root/usr/local/bin/python3"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip3"
# Trust the proxy's CA as the host does.
cp "$host_ca" "$root/etc/ssl/certs/ca-certificates.crt"
# Keep the image small: apt lists and caches are not needed.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

echo "base-image.sh: importing as $image" >&2
tar -C "$root" -c . | docker import \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$image" >/dev/null
docker image ls "$image" >&2
