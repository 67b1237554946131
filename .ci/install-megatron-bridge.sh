#!/usr/bin/env bash
# Megatron-Bridge on CPU for tests/bridge (real HF -> Megatron -> HF exports of a tiny
# Qwen3-MoE). Both packages declare Python >= 3.12, which this machine cannot have;
# on 3.11 they work with two import shims that live in tests/bridge/conftest.py only.
# --no-deps: their GPU requirements (transformer-engine, apex, ...) do not install here;
# the four packages after them are what the CPU path really imports.
#
# pip's resolver then complains about the GPU requirements left out on purpose: that block is
# expected, so it is kept in a log shown only when an install fails; one line says so instead.
set -euo pipefail
PIP="${PIP:-python -m pip}"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
install() {
    if ! $PIP install --quiet "$@" >"$LOG" 2>&1; then
        cat "$LOG" >&2
        echo "install-megatron-bridge: pip install $* failed (its output above)" >&2
        exit 1
    fi
}
install --no-deps --ignore-requires-python megatron-core==0.19.2 megatron-bridge==0.6.2 nvidia-modelopt==0.47.0
install triton==3.6.0 einops==0.8.2 pulp==3.3.2 scipy==1.17.1
echo "install-megatron-bridge: megatron-core 0.19.2 and Megatron-Bridge 0.6.2 installed without their GPU" \
    "requirements (expected; \`pip check\` lists them)"
