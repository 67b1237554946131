"""The `run` command's rooms, each importing only those above it (and nothing of recipe.cli):

- ``preflight``: what makes the machine unfit (devices, files, packages: TRAINER_MODULES, which doctor reads too);
- ``resume_guard``: what verl would resume from, and whether its export holds;
- ``trainer``: `run` itself: checks, the Ray role, the trainer supervised, the export watcher, the smoke verdict.
"""
