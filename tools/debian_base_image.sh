#!/bin/sh
# Build a local Debian bookworm image with Python 3.11 from Debian's own packages (debootstrap, then
# `docker import`), for machines that reach Debian's mirror but no container registry. The Dockerfile
# takes it as its BASE_IMAGE build argument in place of the official python:3.11-slim.
#
#   tools/debian_base_image.sh [TAG] [MIRROR]
#
# Docker keeps the image: a second run with the same TAG does nothing. Needs root, debootstrap, docker.
set -eu
TAG=${1:-mmgate-base:bookworm-py311}
MIRROR=${2:-http://deb.debian.org/debian}
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG already present"
    exit 0
fi
[ "$(id -u)" = "0" ] || { echo "debian_base_image.sh: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debian_base_image.sh: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }
ROOT=$(mktemp -d /tmp/mmgate-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
# minbase: essential packages and apt only; python3-venv brings ensurepip (and pip's wheel) for the
# image's virtual environment; ca-certificates lets the gateway fetch https image URLs.
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOT" "$MIRROR"
# What a container image does not need: apt's lists and caches, man pages, docs, locales.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/usr/share/man/* \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*
tar -C "$ROOT" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/sh"]' - "$TAG"
echo "built base image $TAG"
