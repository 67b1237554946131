#!/usr/bin/env bash
# Prove that the recipe stage is reproducible: two builds of it from this commit, without
# cache, must give the same image ID, for the gpu and the npu image (docker/Dockerfile's recipe stage). Called by
# .ci/images.sh after it built the stand-in framework (the base both stages go on here);
# runs alone too, as root, with a dockerd that holds the stand-in:
#
#   STANDIN=grpo-recipe-standin:local DOCKER_HOST=unix:///... bash .ci/reproducible-recipe.sh
#
# Why buildah: Debian 12's Docker (20.10) has BuildKit 0.8, which stamps every layer and the
# image config with the build's clock; SOURCE_DATE_EPOCH and rewrite-timestamp came in
# BuildKit 0.11 and 0.13 (docs/images.md, "Reproducible builds"). buildah's --timestamp does
# the same here: the config's dates and every file's mtime are set to the commit's time. What
# is left to vary is what the Dockerfile makes, and that is what this checks.
#
# The ID compared is that of the OCI image (skopeo's copy to an OCI layout). buildah's Docker
# format, which the build needs so that SHELL applies, also records the build container's ID
# and hostname, which no BuildKit build writes; the OCI config leaves them out.
#
# A control build with another RECIPE_VERSION must give another ID, and oci_diff.py must name
# the labels file that changed: the comparison can fail.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="${IMAGES_WORKDIR:-/var/lib/grpo-recipe-ci}"
STANDIN="${STANDIN:?STANDIN: the stand-in framework image in the Docker engine at DOCKER_HOST}"
DOCKER_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}"
VERSION="${VERSION:-0.0.0}"

log() { printf '[reproducible] %s\n' "$*"; }
die() { printf '[reproducible] ERROR: %s\n' "$*" >&2; exit 1; }

# buildah's and skopeo's images live beside Docker's data, not in /var/lib/containers.
STORE="$WORK/containers"
mkdir -p "$STORE"
cat >"$STORE/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$STORE/storage"
runroot = "$STORE/run"
EOF
export CONTAINERS_STORAGE_CONF="$STORE/storage.conf"

SOURCE_DATE_EPOCH="$(git -C "$REPO" log -1 --format=%ct 2>/dev/null)" \
    || die "$REPO is not a git checkout: the commit's time is what the builds are dated by"
BASE=localhost/grpo-recipe-standin:reproducible
LAYOUT="$STORE/layout"
BUILT=()
cleanup() {
    [ "${#BUILT[@]}" -gt 0 ] && buildah rmi "${BUILT[@]}" >/dev/null 2>&1
    buildah rmi "$BASE" >/dev/null 2>&1
    rm -rf "$LAYOUT"
    true
}
trap cleanup EXIT

log "copying $STANDIN from the Docker engine into buildah's store"
skopeo copy --quiet --src-daemon-host "$DOCKER_HOST" "docker-daemon:$STANDIN" "containers-storage:$BASE"

build() {  # build DEVICE TAG RECIPE_VERSION: the recipe stage, no cache, into $LAYOUT:TAG
    local device="$1" tag="$2" version="$3" image="localhost/grpo-recipe-reproducible:$2"
    buildah build --quiet --no-cache --pull=never --network=none --format docker \
        --timestamp "$SOURCE_DATE_EPOCH" --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
        --build-arg RECIPE_BASE="$BASE" --build-arg DEVICE="$device" --build-arg RECIPE_VERSION="$version" \
        -f "$REPO/docker/Dockerfile" --target recipe -t "$image" "$REPO" >/dev/null \
        || die "buildah could not build the $device recipe stage"
    BUILT+=("$image")
    skopeo copy --quiet "containers-storage:$image" "oci:$LAYOUT:$tag"
}

status=0
for device in gpu npu; do
    build "$device" "$device-1" "$VERSION"
    build "$device" "$device-2" "$VERSION"
    if "$PYTHON" "$REPO/tests/images/oci_diff.py" "$LAYOUT:$device-1" "$LAYOUT:$device-2" >"$STORE/$device.diff"; then
        log "ok: $device recipe stage, two builds without cache: $(head -1 "$STORE/$device.diff" | cut -d' ' -f2)"
    else
        log "FAIL: two builds of the $device recipe stage from the same commit differ:"
        cat "$STORE/$device.diff"
        status=1
    fi
done

# The control: a changed input must change the ID, and the diff must say where.
build npu control "$VERSION+control"
if "$PYTHON" "$REPO/tests/images/oci_diff.py" "$LAYOUT:npu-1" "$LAYOUT:control" >"$STORE/control.diff"; then
    die "a build with another RECIPE_VERSION gave the same image ID: the comparison cannot fail"
fi
grep -q 'etc/grpo-recipe/labels.d/recipe.labels' "$STORE/control.diff" \
    || { cat "$STORE/control.diff"; die "oci_diff.py did not name the labels file that the control changed"; }
log "ok: the control (RECIPE_VERSION=$VERSION+control) gives another ID, and the diff names its labels file"
exit "$status"
