#!/usr/bin/env bash
# Prove, without CANN, that the npu image's Python lock is complete and CANN is all it lacks:
#
#   PYTHON=/path/to/venv/bin/python bash .ci/npu-closure.sh     # needs pyelftools==0.33
#
# 1. Downloads every pin of docker/npu/requirements.lock, hash-checked, wheels only
#    (--only-binary :all:), for the image's interpreter and platform: CPython 3.12, aarch64,
#    glibc 2.35 (Ubuntu 22.04, the CANN base). pip does not expand a manylinux level
#    downwards, so every level from 2_35 to 2_17 (and manylinux2014) is listed.
# 2. Reports, from PyPI's index, which pins of requirements-source.lock, vllm-source.lock and
#    vllm-ascend-source.lock have a wheel for that platform (the Dockerfile builds them from
#    their sdists; vllm-ascend on CANN_CHIP=a3 only) and downloads those sdists, sha256-checked
#    against the locks.
# 3. Runs docker/npu/closure.py over the wheels: every DT_NEEDED of every ELF file must come
#    from a wheel, Ubuntu 22.04's base system or docker/npu/cann-libraries.txt, and no
#    symbol version may need more than glibc 2.35 / GCC 12's libstdc++.
#
# The files stay in one folder outside the clone (NPU_WHEEL_CACHE, default
# /var/lib/grpo-recipe-ci/wheels/npu): a rerun first tries the cache alone (--no-index) and
# goes to PyPI only for what is missing, so an unchanged lock needs no network at all.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
CACHE="${NPU_WHEEL_CACHE:-/var/lib/grpo-recipe-ci/wheels/npu}"
LOCK="$REPO/docker/npu/requirements.lock"
SOURCE_LOCKS=("$REPO/docker/npu/requirements-source.lock" "$REPO/docker/npu/vllm-source.lock"
              "$REPO/docker/npu/vllm-ascend-source.lock")
INDEX="${NPU_INDEX_URL:-https://pypi.org/simple}"

log() { printf '[npu-closure] %s\n' "$*"; }
die() { printf '[npu-closure] ERROR: %s\n' "$*" >&2; exit 1; }
START=$(date +%s)
elapsed() { echo "$(( $(date +%s) - START )) s"; }

"$PYTHON" -c 'import elftools' 2>/dev/null \
    || die "$PYTHON lacks pyelftools: $PYTHON -m pip install pyelftools==0.33"
mkdir -p "$CACHE/sdist"

# Only the lock's own index and this script's flags: no user/site pip config (find-links,
# extra indexes, constraints), but the environment's CA settings (PIP_CERT) still apply.
pip_download() {
    env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
        "$PYTHON" -m pip download --disable-pip-version-check --progress-bar off \
        --no-deps --require-hashes --only-binary :all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        "${PLATFORMS[@]}" -d "$CACHE" "$@"
}
PLATFORMS=()
for minor in $(seq 35 -1 17); do PLATFORMS+=(--platform "manylinux_2_${minor}_aarch64"); done
PLATFORMS+=(--platform manylinux2014_aarch64 --platform any)

pins=$(grep -cE '^[A-Za-z0-9][A-Za-z0-9._-]*==' "$LOCK")
log "1/3 download: $pins pins of ${LOCK#"$REPO"/} into $CACHE"
t0=$(date +%s)
if pip_download --no-index --find-links "$CACHE" -r "$LOCK" >"$CACHE/.download.log" 2>&1; then
    log "    every wheel was already in the cache (hashes re-checked, no network)"
else
    log "    cache incomplete: fetching the rest from $INDEX"
    pip_download --index-url "$INDEX" -r "$LOCK" >"$CACHE/.download.log" 2>&1 \
        || { tail -20 "$CACHE/.download.log" >&2; die "download failed (log: $CACHE/.download.log)"; }
fi
log "    done in $(( $(date +%s) - t0 )) s; cache: $(find "$CACHE" -maxdepth 1 -name '*.whl' | wc -l) wheels, $(du -sh "$CACHE" | cut -f1)"

log "2/3 source-only pins (built in the Dockerfile's builder stage)"
"$PYTHON" - "$INDEX" "$CACHE/sdist" "${SOURCE_LOCKS[@]}" <<'PY'
"""For each pin of the source locks: which wheels PyPI has for aarch64 (or any), and
its sdist, downloaded once and checked against the lock's sha256."""
import hashlib, json, re, sys, urllib.request
from pathlib import Path

index, dest, locks = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
pin = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)(.*)$")
for lock in locks:
    text = Path(lock).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        match = pin.match(line.strip())
        if not match:
            continue
        name, version, rest = match.groups()
        hashes = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", rest))
        answer = dest / f"{name}-{version}.index.json"  # the index's answer, kept: reruns stay offline
        if not answer.exists():
            request = urllib.request.Request(
                f"{index}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                answer.write_bytes(response.read())
        files = json.loads(answer.read_bytes())["files"]
        stem = re.sub(r"[-_.]+", "_", name).lower()
        prefix = f"{stem}_{re.sub(r'[-_.]+', '_', version)}_"
        mine = [f for f in files if re.sub(r"[-_.]+", "_", f["filename"]).lower().startswith(prefix)]
        wheels = [f["filename"] for f in mine if f["filename"].endswith(".whl")
                  and ("aarch64" in f["filename"] or f["filename"].endswith("-any.whl"))]
        sdists = [f for f in mine if f["filename"].endswith((".tar.gz", ".zip"))
                  and f["hashes"].get("sha256") in hashes]
        if not sdists:
            sys.exit(f"    {name}=={version}: no sdist on the index matches the lock's sha256")
        sdist = sdists[0]
        target = dest / sdist["filename"]
        if not target.exists() or hashlib.sha256(target.read_bytes()).hexdigest() != sdist["hashes"]["sha256"]:
            with urllib.request.urlopen(sdist["url"], timeout=300) as response:
                data = response.read()
            if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
                sys.exit(f"    {name}=={version}: downloaded sdist does not match its sha256")
            target.write_bytes(data)
        kind = f"aarch64 wheels exist but are not used: {', '.join(wheels)}" if wheels else "sdist only"
        print(f"    {name}=={version}: {kind}; sdist {sdist['filename']} "
              f"({target.stat().st_size // 1024} KiB) sha256 ok")
PY

log "3/3 shared-library closure of every wheel in the lock"
t0=$(date +%s)
set +e
"$PYTHON" "$REPO/docker/npu/closure.py" "$CACHE" --lock "$LOCK" --all --machine aarch64
status=$?
set -e
log "    closure check took $(( $(date +%s) - t0 )) s; whole script $(elapsed); cache $(du -sh "$CACHE" | cut -f1)"
[ "$status" -eq 0 ] || die "the npu lock's native libraries are not closed (see above)"
log "closed: every library the npu wheels need comes from a wheel, Ubuntu 22.04 or CANN's list"
