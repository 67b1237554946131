#!/usr/bin/env bash
# Megatron-Bridge on CPU for tests/bridge (real HF -> Megatron -> HF exports of a tiny
# Qwen3-MoE). Both packages declare Python >= 3.12, which this machine cannot have;
# on 3.11 they work with two import shims that live in tests/bridge/conftest.py only.
# --no-deps: their GPU requirements (transformer-engine, apex, ...) do not install here;
# the four packages after them are what the CPU path really imports.
set -euo pipefail
PIP="${PIP:-python -m pip}"
$PIP install --quiet --no-deps --ignore-requires-python \
    megatron-core==0.19.2 megatron-bridge==0.6.2 nvidia-modelopt==0.47.0
$PIP install --quiet triton==3.6.0 einops==0.8.2 pulp==3.3.2 scipy==1.17.1
