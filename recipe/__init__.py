"""GRPO training recipe for Qwen3.5-35B-A3B on gpu and npu.

Nothing heavy is imported here: `plan` must stay fast and must not import torch,
ray or verl.

The rooms, each importing only rooms above it (tests/unit/test_import_rooms.py checks that
no module reaches itself):

    hydra_text, errors, atomic,           text Hydra reads back literally; the error type; atomic writes;
      read_back, numbers                  files and numbers read back from outside, within bounds
    settings, env_warnings, device,       inputs: the environment (and what in it no setting reads), the machine,
      chip, image_facts,                  the npu chip, the image's labels, locks and versions, the model
      model_sizes, models
    cluster.rules, layout, allocator      the rules a plan must satisfy
    launch, user_overrides, verl_config   the overrides (the recipe's, the user's, composed in verl's config)
    memory_workload, memory_fit           what the overrides decide about memory; will the run fit (device, host)
    digests, record_file, provenance      the run record and its hashes
    checkpoint_tracker, run_length        where a resume starts and how long the run is
    plan                                  everything decided before anything starts
    export, data, smoke, doctor, replay   the commands' own packages (replay_files: the files replay
                                          writes, one per reader)
    run (preflight, resume_guard,         `run` itself; cluster.ray_node/readiness/supervisors below it
      finish, progress, trainer)
    trainer_main                          the trainer's process: verl's main, ended with its own status
    cli                                   the command line: parser, help, dispatch
"""

__version__ = "0.1.0"
