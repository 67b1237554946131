"""Runs at start-up in every Python process of the e2e run (this folder is on PYTHONPATH, tests/e2e/harness/plan.py),
including those that never import verl: vLLM's engine and model-inspection subprocesses build Qwen3-VL's image and
video processors, which import torchvision. tests/support/torchvision_cpu.py says why it needs help on CPU."""

from tests.support.torchvision_cpu import install

install()
