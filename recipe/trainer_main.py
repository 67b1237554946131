"""`python -m recipe.trainer_main <overrides>`: verl's GRPO trainer, whose process ends with the run's own status.

verl's `python -m verl.trainer.main_ppo` hosts Ray's driver, and verl 0.9.1's run_ppo never calls
ray.shutdown(): after a finished run, interpreter teardown can crash under Ray's leftover native
threads (SIGSEGV, exit 139, the log complete; verl#1299, verl#2012, ray#36885), and a restart
policy then trains the finished run again. Run through here, verl's own `main` (the same Hydra
entry, reading the same argv) returns once fit() is done, its last save written (verl saves
synchronously), and the process ends through recipe.process_exit: status 0, or 1 with the
traceback Hydra printed, never through the teardown. Nothing of the recipe is imported beyond
process_exit: the trainer's process stays verl's.
"""

from __future__ import annotations

from recipe.process_exit import run_program


def main() -> int:
    """verl.trainer.main_ppo's main with this process's argv; 0 once it returned (an exception propagates)."""
    # lazy: verl is heavy or absent where this module is imported; loaded only here
    from verl.trainer.main_ppo import main as verl_main

    verl_main()
    return 0


if __name__ == "__main__":
    run_program(main)
