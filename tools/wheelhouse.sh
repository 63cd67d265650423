#!/bin/sh
# Fill a wheelhouse with the wheels of mmgate's runtime dependencies and its otel extra (the image
# installs both), and setuptools, its build backend, on a machine that reaches the package index, for
# an image built where nothing does:
#
#   tools/wheelhouse.sh [DIR] [PYTHON]     # DIR defaults to deploy/docker/wheelhouse
#   docker build --build-arg PIP_OFFLINE=1 .
#
# PYTHON (default python3) must be the image's Python minor version (3.11) on the same libc family
# (glibc), so that the wheels it picks install in the image. mmgate itself is not in it: the image
# builds mmgate from the checkout it is built from. async-timeout is added by name: redis needs it on
# Python < 3.11.3 (Debian bookworm's 3.11.2), which a newer host Python would not fetch.
set -eu
HERE=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$HERE/deploy/docker/wheelhouse}
PY=${2:-python3}
mkdir -p "$DIR"
"$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$DIR" "$HERE[otel]" 'setuptools>=77' 'async-timeout>=4.0.3'
rm -f "$DIR"/mmgate-*.whl
ls "$DIR" | grep -c '\.whl$' | xargs echo "wheels in $DIR:"
