"""GRPO training recipe for Qwen3.5-35B-A3B on gpu and npu.

Nothing heavy is imported here: `plan` must stay fast and must not import torch,
ray or verl.

The rooms, each importing only rooms above it (tests/unit/test_import_rooms.py checks that
no module reaches itself):

    hydra_text, errors, atomic            text Hydra reads back literally; the error type; atomic writes
    settings, device, chip,               inputs: the environment, the machine, the npu chip, the model
      model_sizes, models
    cluster.rules, layout, allocator      the rules a plan must satisfy
    launch, user_overrides, verl_config   the overrides (the recipe's, the user's, composed in verl's config)
    memory_fit                            will the planned run fit in device memory and host RAM
    digests, record_file, provenance      the run record and its hashes
    plan                                  everything decided before anything starts
    export, data, smoke, doctor, replay   the commands' own packages
    run (preflight, resume_guard,         `run` itself; cluster.ray_node/readiness/supervisors below it
      trainer)
    cli                                   the command line: parser, help, dispatch
"""

__version__ = "0.1.0"
