#!/usr/bin/env bash
# Build the recipe stage of BOTH images with a real Docker engine and run the common
# testinfra checks against each. Called by .ci/run; runs alone too (as root):
#
#   PYTHON=/path/to/venv/bin/python bash .ci/images.sh
#
# PYTHON must have pytest and pytest-testinfra. Needs Debian's apt and PyPI, nothing else:
# no registry is reachable here, so the base image is made with mmdebstrap and the real
# framework stage (CUDA/CANN, Python 3.12) is replaced by a stand-in (docker/standin/).
# The full images are built and fully tested by .github/workflows/images.yml instead.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${IMAGES_WORKDIR:-/tmp/grpo-recipe-images}"
export DOCKER_HOST="unix://${WORK}/docker.sock"
# Debian's CLI: it has BuildKit built in; a newer CLI elsewhere on PATH may lack buildx.
DOCKER=/usr/bin/docker
export DOCKER_BUILDKIT=1
STANDIN=grpo-recipe-standin:local
BASE=grpo-recipe-base:bookworm

log() { printf '[images] %s\n' "$*"; }

install_tools() {
    if [ -x /usr/sbin/dockerd ] && [ -x "$DOCKER" ] && command -v mmdebstrap >/dev/null; then
        return
    fi
    log "installing docker.io and mmdebstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io mmdebstrap >/dev/null
}

DOCKERD_PID=""
stop_dockerd() {
    # Stop only the daemon this script started, by its pid; wait so its mounts are gone.
    if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
        log "stopping dockerd (pid $DOCKERD_PID)"
        kill "$DOCKERD_PID"
        for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
    fi
    # dockerd leaves its network namespace mounted under the exec root: release what
    # it mounted under $WORK (deepest first), or the folder cannot be removed.
    awk -v work="$WORK/" 'index($2, work) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount 2>/dev/null || true
}

start_dockerd() {
    mkdir -p "$WORK"
    /usr/sbin/dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" \
        -H "$DOCKER_HOST" --pidfile "$WORK/dockerd.pid" >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    trap stop_dockerd EXIT
    for _ in $(seq 1 60); do
        if "$DOCKER" info >/dev/null 2>&1; then log "dockerd ready (pid $DOCKERD_PID)"; return; fi
        kill -0 "$DOCKERD_PID" 2>/dev/null || { cat "$WORK/dockerd.log"; exit 1; }
        sleep 1
    done
    log "dockerd did not become ready"; tail -20 "$WORK/dockerd.log"; exit 1
}

build_base() {
    if "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then return; fi
    log "building $BASE with mmdebstrap"
    # python3-venv and tini here, so the stand-in needs no apt inside a build.
    mmdebstrap --quiet --variant=minbase --include=python3-venv,tini,ca-certificates \
        bookworm "$WORK/rootfs.tar"
    "$DOCKER" import "$WORK/rootfs.tar" "$BASE" >/dev/null
    rm -f "$WORK/rootfs.tar"
}

# The stand-in's wheels are fetched here, on the host, whose pip trusts this network's TLS
# setup; the build then runs offline from that context.
build_standin() {
    local context="$WORK/standin-context" platforms=()
    local glibc
    for glibc in $(seq 36 -1 17); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
    rm -rf "$context" && mkdir -p "$context/wheels"
    cp "$REPO/docker/standin/requirements.lock" "$context/"
    "$PYTHON" -m pip download --quiet --no-deps --require-hashes --only-binary :all: \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        "${platforms[@]}" --platform manylinux2014_x86_64 --platform any \
        -r "$context/requirements.lock" -d "$context/wheels"
    log "building $STANDIN"
    "$DOCKER" build --quiet -f "$REPO/docker/standin/Dockerfile" -t "$STANDIN" "$context" >/dev/null
}

recipe_version() {
    "$PYTHON" - "$REPO" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1] + "/tests/images")
from repo_version import repo_version
print(repo_version())
EOF
}

build_recipe() {  # $1 = gpu | npu
    local start
    start=$(date +%s%N)
    "$DOCKER" build --quiet -f "$REPO/docker/$1/Dockerfile" --target recipe \
        --build-arg RECIPE_BASE="$STANDIN" --build-arg RECIPE_VERSION="$VERSION" \
        -t "grpo-recipe:$1" "$REPO" >/dev/null
    log "built grpo-recipe:$1 (recipe stage on $STANDIN) in $(( ($(date +%s%N) - start) / 1000000 )) ms"
}

# The suite must be able to fail: an image whose user is root has to be caught.
check_root_is_caught() {
    local bad=grpo-recipe:root-check
    printf 'FROM grpo-recipe:gpu\nUSER root\n' | "$DOCKER" build --quiet -t "$bad" - >/dev/null
    if "$PYTHON" -m pytest -q -p no:cacheprovider "$REPO/tests/images/common/test_user.py" \
        --image "$bad" >"$WORK/root-check.log" 2>&1; then
        log "FAIL: the image tests passed on an image that runs as root"; exit 1
    fi
    log "ok: the image tests fail on an image that runs as root"
    "$DOCKER" rmi "$bad" >/dev/null
}

main() {
    install_tools
    start_dockerd
    build_base
    VERSION="$(recipe_version)"
    build_standin
    for device in gpu npu; do build_recipe "$device"; done
    check_root_is_caught
    local status=0
    # The compose checks that need an engine (skipped in the plain pytest run): `plan`
    # through `docker compose run` against the images just built.
    log "compose checks against the built images"
    "$PYTHON" -m pytest -p no:cacheprovider "$REPO/tests/deploy/test_compose.py" -k "engine or built_image" \
        || status=1
    for device in gpu npu; do
        log "testing grpo-recipe:$device"
        "$PYTHON" -m pytest -p no:cacheprovider "$REPO/tests/images" --image "grpo-recipe:$device" \
            || status=1
    done
    return "$status"
}

main "$@"
