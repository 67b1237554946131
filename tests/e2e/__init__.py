"""CPU end to end: the recipe's own GRPO plan run by verl 0.9.1 on the Megatron engine (see docs/smoke.md).

Runs only in the e2e venv (.ci/install-e2e.sh), never in the main test run (pyproject's
testpaths leave this folder out): `.venv-e2e/bin/pytest tests/e2e`.
"""
