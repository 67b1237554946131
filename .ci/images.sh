#!/usr/bin/env bash
# Build the images with a real Docker engine and run the testinfra suite against each.
# Called by .ci/run; runs alone too (as root):
#
#   PYTHON=/path/to/venv/bin/python bash .ci/images.sh
#
# - gpu: the WHOLE image (framework with Transformer Engine compiled, then the recipe stage)
#   on a local Python 3.12 trixie base, and the whole image suite, framework tests included.
# - npu: the recipe stage on a stand-in framework (CANN cannot be obtained here; see
#   docs/images.md), and the suite's non-framework checks.
#
# No registry is reachable here, so bases are made with mmdebstrap + `docker import`:
# grpo-recipe-python:3.12-trixie stands for the official python:3.12-slim-trixie (pyenv's
# CPython 3.12.1 copied under /usr/local, as the official image has it), and a bookworm
# base carries the stand-in. Docker's data lives in one stable folder outside the clone
# (IMAGES_WORKDIR, default /var/lib/grpo-recipe-ci): a rerun on the same machine reuses
# its build cache and takes minutes; a cold run compiles Transformer Engine (~20 min).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${IMAGES_WORKDIR:-/var/lib/grpo-recipe-ci}"
export DOCKER_HOST="unix://${WORK}/docker.sock"
# Debian's CLI: it has BuildKit built in; a newer CLI elsewhere on PATH may lack buildx.
DOCKER=/usr/bin/docker
export DOCKER_BUILDKIT=1
PYTHON_BASE=grpo-recipe-python:3.12-trixie
STANDIN=grpo-recipe-standin:local
STANDIN_BASE=grpo-recipe-base:bookworm
# A cold build peaks at about 45 GB of Docker data (docs/images.md); what the cache already
# holds counts towards it.
MIN_FREE_GB="${IMAGES_MIN_FREE_GB:-50}"
# A warm run (the gpu image of this lock cached) rebuilds the recipe stages only: 7 MB were left
# written after its prune here (its "written by this run" line says how much); the floor is room
# for those stages and the test containers while they run.
WARM_MIN_FREE_GB="${IMAGES_WARM_MIN_FREE_GB:-8}"
# Transformer Engine's compile jobs: each takes 2-3 GB of memory.
MAX_JOBS="${MAX_JOBS:-2}"
# The host's CA bundle, passed to pip inside the build as a BuildKit secret (never stored in
# a layer): this network intercepts TLS.
PIP_CA="${PIP_CA:-/etc/ssl/certs/ca-certificates.crt}"

log() { printf '[images] %s\n' "$*"; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

PHASE_NAME="" PHASE_START=0
declare -a PHASES=()
phase() {  # phase NAME: ends the running phase (printing its time) and starts NAME
    local now
    now=$(date +%s)
    if [ -n "$PHASE_NAME" ]; then
        PHASES+=("$(printf '%-34s %5d s' "$PHASE_NAME" $((now - PHASE_START)))")
        log "phase '$PHASE_NAME' took $((now - PHASE_START)) s"
    fi
    PHASE_NAME="$1" PHASE_START=$now
}
print_phases() {
    phase ""
    log "phase times:"
    printf '[images]   %s\n' "${PHASES[@]}"
}

install_tools() {
    # buildah and skopeo: the reproducibility check (.ci/reproducible-recipe.sh).
    if [ -x /usr/sbin/dockerd ] && [ -x "$DOCKER" ] && command -v mmdebstrap >/dev/null \
        && command -v buildah >/dev/null && command -v skopeo >/dev/null; then
        return
    fi
    log "installing docker.io, mmdebstrap, buildah and skopeo"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io mmdebstrap buildah skopeo >/dev/null
}

python312() {
    # pyenv's CPython 3.12.1: the only Python 3.12 this kind of machine has.
    local root
    command -v pyenv >/dev/null || die "pyenv not found: the gpu image's Python 3.12 base is made from pyenv's 3.12.1 (docs/images.md)"
    root="$(pyenv root)/versions/3.12.1"
    [ -x "$root/bin/python3.12" ] || die "$root/bin/python3.12 not found: pyenv's CPython 3.12.1 is needed for the gpu image's base"
    printf '%s' "$root"
}

gb() { echo $(( $1 / 1024 / 1024 )); }  # gb KILOBYTES
data_kb() { if [ -d "$WORK/data" ]; then du -sk "$WORK/data" 2>/dev/null | cut -f1; else echo 0; fi; }

gpu_built_from_lock() {
    # The last run's grpo-recipe:gpu was built from this very lock: its framework layers are cached.
    "$DOCKER" image inspect grpo-recipe:gpu >/dev/null 2>&1 && "$DOCKER" run --rm --entrypoint cat grpo-recipe:gpu \
        /etc/grpo-recipe/requirements.lock 2>/dev/null | cmp -s - "$REPO/docker/gpu/requirements.lock"
}

check_disk() {
    # Run with dockerd up: whether the gpu image is cached decides what the build needs.
    local free_kb used_kb
    free_kb=$(df --output=avail -k "$WORK" | tail -1)
    used_kb=$(data_kb)
    DATA_KB_AT_START=$used_kb
    if gpu_built_from_lock; then
        if [ "$(gb "$free_kb")" -lt "$WARM_MIN_FREE_GB" ]; then
            die "$WORK: $(gb "$free_kb") GB free < ${WARM_MIN_FREE_GB} GB needed to rebuild the recipe stages on the cached gpu image (IMAGES_WARM_MIN_FREE_GB)"
        fi
    elif [ "$(gb $((free_kb + used_kb)))" -lt "$MIN_FREE_GB" ]; then
        die "$WORK: $(gb "$free_kb") GB free + $(gb "$used_kb") GB already cached < ${MIN_FREE_GB} GB needed for a cold gpu image build (IMAGES_MIN_FREE_GB)"
    fi
    log "disk: $(gb "$free_kb") GB free, $(gb "$used_kb") GB cached in $WORK/data"
}

prune_replaced() {
    # Each rebuild leaves the replaced recipe stages untagged (about 0.5 GB apiece): drop them, and
    # the test containers' anonymous volumes, so that repeated runs do not fill the disk. The build
    # cache stays.
    "$DOCKER" image prune --force >/dev/null
    "$DOCKER" volume prune --force >/dev/null
    local now_kb
    now_kb=$(data_kb)
    log "disk: $(gb "$now_kb") GB in $WORK/data, $(( (now_kb - DATA_KB_AT_START) / 1024 )) MB written by this run"
}

DOCKERD_PID=""
stop_dockerd() {
    # Stop only the daemon this script started, by its pid; wait so its mounts are gone.
    if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
        log "stopping dockerd (pid $DOCKERD_PID)"
        kill "$DOCKERD_PID"
        for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
        # dockerd leaves its network namespace mounted under the exec root: release what
        # it mounted under $WORK (deepest first), or the folder cannot be removed.
        awk -v work="$WORK/" 'index($2, work) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount 2>/dev/null || true
    fi
}

start_dockerd() {
    if "$DOCKER" info >/dev/null 2>&1; then
        log "using the dockerd already serving $DOCKER_HOST"
        return
    fi
    /usr/sbin/dockerd --data-root "$WORK/data" --exec-root "$WORK/exec" \
        -H "$DOCKER_HOST" --pidfile "$WORK/dockerd.pid" >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 1 60); do
        if "$DOCKER" info >/dev/null 2>&1; then log "dockerd ready (pid $DOCKERD_PID)"; return; fi
        kill -0 "$DOCKERD_PID" 2>/dev/null || { cat "$WORK/dockerd.log"; exit 1; }
        sleep 1
    done
    log "dockerd did not become ready"; tail -20 "$WORK/dockerd.log"; exit 1
}

build_python_base() {
    # The local equivalent of python:3.12-slim-trixie: Debian trixie (glibc 2.41) with
    # CPython 3.12 under /usr/local, its shared libpython found through ldconfig.
    local python
    python="$(python312)"
    if "$DOCKER" image inspect "$PYTHON_BASE" >/dev/null 2>&1; then return; fi
    log "building $PYTHON_BASE with mmdebstrap from $python"
    mmdebstrap --quiet --variant=minbase \
        --include=ca-certificates,netbase,tzdata,libssl3t64,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,libreadline8t64,libncursesw6,libuuid1,zlib1g,libexpat1,libcrypt1,libnsl2,libtirpc3t64 \
        --customize-hook="tar -C '$python' -c bin include lib share | tar -C \"\$1/usr/local\" -x" \
        --customize-hook='rm -rf "$1"/usr/local/lib/python3.12/test "$1"/usr/local/lib/python3.12/site-packages/*' \
        --customize-hook='chroot "$1" ldconfig' \
        --customize-hook='chroot "$1" /usr/local/bin/python3 -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, venv"' \
        trixie "$WORK/rootfs-python.tar"
    "$DOCKER" import --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' "$WORK/rootfs-python.tar" "$PYTHON_BASE" >/dev/null
    rm -f "$WORK/rootfs-python.tar"
}

build_standin_base() {
    if "$DOCKER" image inspect "$STANDIN_BASE" >/dev/null 2>&1; then return; fi
    log "building $STANDIN_BASE with mmdebstrap"
    # python3-venv and tini here, so the stand-in needs no apt inside a build.
    mmdebstrap --quiet --variant=minbase --include=python3-venv,tini,ca-certificates \
        bookworm "$WORK/rootfs.tar"
    "$DOCKER" import "$WORK/rootfs.tar" "$STANDIN_BASE" >/dev/null
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

build_gpu() {
    # The whole gpu image (docker/Dockerfile, DEVICE=gpu: its framework with Transformer Engine
    # compiled, then the recipe), as `docker compose build gpu` builds it; the log is kept for
    # the build-time record.
    local secret=()
    [ -s "$PIP_CA" ] && secret=(--secret "id=pip-ca,src=$PIP_CA")
    log "building grpo-recipe:gpu (full framework; log: $WORK/build-gpu.log)"
    if ! "$DOCKER" build --progress=plain -f "$REPO/docker/Dockerfile" --build-arg DEVICE=gpu \
        --build-arg PYTHON_IMAGE="$PYTHON_BASE" --build-arg MAX_JOBS="$MAX_JOBS" \
        --build-arg RECIPE_VERSION="$VERSION" --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" "${secret[@]}" \
        -t grpo-recipe:gpu "$REPO" >"$WORK/build-gpu.log" 2>&1; then
        tail -40 "$WORK/build-gpu.log"
        die "the gpu image did not build"
    fi
    log "grpo-recipe:gpu: $("$DOCKER" image inspect --format '{{.Size}}' grpo-recipe:gpu | awk '{printf "%.1f GB", $1/1e9}')"
}

build_npu_recipe() {
    # The recipe stage alone, on the stand-in framework (BuildKit never reaches the CANN stages).
    "$DOCKER" build --quiet -f "$REPO/docker/Dockerfile" --build-arg DEVICE=npu \
        --build-arg RECIPE_BASE="$STANDIN" --build-arg RECIPE_VERSION="$VERSION" \
        --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" -t grpo-recipe:npu "$REPO" >/dev/null
}

# The suite must be able to fail: an image whose user is root has to be caught.
check_root_is_caught() {
    local bad=grpo-recipe:root-check
    printf 'FROM grpo-recipe:gpu\nUSER root\n' | "$DOCKER" build --quiet -t "$bad" - >/dev/null
    if "$PYTHON" -m pytest -q -p no:cacheprovider "$REPO/tests/images/common/test_user.py" \
        --image "$bad" >"$WORK/root-check.log" 2>&1; then
        die "the image tests passed on an image that runs as root"
    fi
    log "ok: the image tests fail on an image that runs as root"
    "$DOCKER" rmi "$bad" >/dev/null
}

main() {
    phase "tools and disk"
    install_tools
    python312 >/dev/null
    mkdir -p "$WORK"
    start_dockerd
    trap 'print_phases; stop_dockerd' EXIT
    check_disk
    VERSION="$(recipe_version)"
    # The commit's time dates the recipe stage's files (docs/images.md, "Reproducible builds").
    SOURCE_DATE_EPOCH="$(git -C "$REPO" log -1 --format=%ct)"
    phase "bases (mmdebstrap)"
    build_python_base
    build_standin_base
    phase "gpu image (framework + recipe)"
    build_gpu
    phase "npu recipe stage on the stand-in"
    build_standin
    build_npu_recipe
    phase "reproducible recipe stage"
    STANDIN="$STANDIN" VERSION="$VERSION" PYTHON="$PYTHON" IMAGES_WORKDIR="$WORK" \
        bash "$REPO/.ci/reproducible-recipe.sh"
    phase "image tests"
    check_root_is_caught
    local status=0
    # The compose checks that need an engine (skipped in the plain pytest run): `plan`
    # through `docker compose run` against the images just built.
    log "compose checks against the built images"
    "$PYTHON" -m pytest -p no:cacheprovider "$REPO/tests/deploy/test_compose.py" -k "engine or built_image" \
        || status=1
    for device in gpu npu; do
        log "testing grpo-recipe:$device"
        # --require-framework: on the full gpu image a skipped framework test is a failure.
        # Two workers, a file each at a time (module fixtures run once): each worker has its own container.
        "$PYTHON" -m pytest -p no:cacheprovider -n 2 --dist loadfile "$REPO/tests/images" --image "grpo-recipe:$device" \
            $([ "$device" = gpu ] && echo --require-framework) || status=1
    done
    prune_replaced
    return "$status"
}

# The part of the build that mostly waits on the network and the disk: the tools, the bases, and the gpu lock's
# wheels (~10 GB) fetched into BuildKit's pip cache mount, which the gpu image's own install step shares (the same
# cache id: its target; the same pip, from the same Python's venv). .ci/run starts it in the background while the tests run; the build proper then installs
# from that cache instead of downloading. Nothing is exported (cacheonly); its own dockerd, stopped at its end.
prefetch() {
    phase "tools and disk"
    install_tools
    python312 >/dev/null
    mkdir -p "$WORK"
    start_dockerd
    trap 'print_phases; stop_dockerd' EXIT
    check_disk
    phase "bases (mmdebstrap)"
    build_python_base
    build_standin_base
    phase "gpu wheels into the pip cache"
    if gpu_built_from_lock; then
        log "grpo-recipe:gpu was built from this lock: its layers are cached, no wheel to fetch"
        return
    fi
    local secret=()
    [ -s "$PIP_CA" ] && secret=(--secret "id=pip-ca,src=$PIP_CA")
    if ! "$DOCKER" build --progress=plain --output type=cacheonly -f - "${secret[@]}" "$REPO/docker/gpu" \
        >"$WORK/prefetch-gpu-wheels.log" 2>&1 <<EOF
FROM $PYTHON_BASE
COPY requirements.lock /tmp/lock/
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \\
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \\
 && python3 -m venv /tmp/venv \\
 && /tmp/venv/bin/pip download --quiet --no-deps --require-hashes --only-binary :all: -d /tmp/wheels \\
        -r /tmp/lock/requirements.lock \\
 && rm -rf /tmp/wheels /tmp/venv
EOF
    then
        tail -40 "$WORK/prefetch-gpu-wheels.log"
        die "the gpu lock's wheels did not download"
    fi
}

case "${1:-}" in
    "") main ;;
    prefetch) prefetch ;;
    *) die "usage: images.sh [prefetch]" ;;
esac
