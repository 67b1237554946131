"""The `run` command's rooms, each importing only those above it (and nothing of recipe.cli):

- ``preflight``: what makes the machine unfit (devices, files, host RAM, packages: TRAINER_MODULES, which doctor reads too);
- ``resume_guard``: what verl would resume from, and whether its export holds;
- ``progress``: one line per training step, read from verl's TensorBoard event files;
- ``trainer``: `run` itself: checks, the Ray role, the trainer supervised, the export watcher, the smoke verdict.
"""
