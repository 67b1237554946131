"""GRPO training recipe for Qwen3.5-35B-A3B on gpu and npu.

Nothing heavy is imported here: `plan` must stay fast and must not import torch,
ray or verl.
"""

__version__ = "0.1.0"
