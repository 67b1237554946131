"""Lenient Hugging Face export, checked: what Megatron-Bridge wrote and whether it is usable.

Modules (each imports torch/transformers only inside its functions):
- jsonsafe: a JSON writer for config objects that never raises on an odd value;
- shards, expected, hf_check, report: the check of an exported HF checkpoint;
- watch: find verl's HF exports under a checkpoint directory and check each new one;
- bridge_export: export a verl Megatron checkpoint to HF with Megatron-Bridge, then check;
- verl_patch: route verl 0.9.1's transformer_config.json through jsonsafe (version-checked);
- commands: the `verify-export` and `export` subcommands.
"""
