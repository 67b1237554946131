"""`python -m recipe.trainer_main <overrides>`: verl's GRPO trainer, whose process ends with the run's own status.

verl's `python -m verl.trainer.main_ppo` hosts Ray's driver, and verl 0.9.1's run_ppo never calls
ray.shutdown(): after a finished run, interpreter teardown can crash under Ray's leftover native
threads (SIGSEGV, exit 139, the log complete; verl#1299, verl#2012, ray#36885), and a restart
policy then trains the finished run again. Run through here, verl's own `main` (the same Hydra
entry, reading the same argv) returns once fit() is done, its last save written (verl saves
synchronously), and the process ends through recipe.process_exit: status 0, or 1 with the
traceback Hydra printed, never through the teardown.

One change to verl's start: its TaskRunner (the actor that drives the whole run) is placed on Ray's head node,
where this driver and the recipe's `run` live, instead of wherever Ray finds a CPU (a worker, in the two-node
e2e). A lost worker then never takes the run's driver with it: the head's `run` sees the loss and ends the run
(recipe.cluster.node_watch), the same way whichever node is lost. Nothing else of the recipe is imported beyond
process_exit: the trainer's process stays verl's.
"""

from __future__ import annotations

from typing import Any

from recipe.process_exit import run_program

#: Ray's own resource of the head node (ray._common.constants.HEAD_NODE_RESOURCE_NAME); Ray pins its own state
#: actors there the same way, asking a thousandth of it.
HEAD_NODE_RESOURCE = "node:__internal_head__"
ON_THE_HEAD = {HEAD_NODE_RESOURCE: 0.001}


class OnTheHead:
    """A Ray actor class whose actors are placed on the head node: `.remote()` and `.options()` as the class's own."""

    def __init__(self, actor_class: Any) -> None:
        self.actor_class = actor_class

    def options(self, **options: Any) -> Any:
        """The class's options with the head node's resource added to any the caller asks for."""
        resources = {**(options.pop("resources", None) or {}), **ON_THE_HEAD}
        return self.actor_class.options(resources=resources, **options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Start the actor on the head node."""
        return self.options().remote(*args, **kwargs)


def main() -> int:
    """verl.trainer.main_ppo's main with this process's argv, its TaskRunner on the head; 0 once it returned."""
    # lazy: verl is heavy or absent where this module is imported; loaded only here
    from verl.trainer import main_ppo

    # verl's main reads the class from its module when it starts the run (run_ppo(config, TaskRunnerV1)).
    main_ppo.TaskRunnerV1 = OnTheHead(main_ppo.TaskRunnerV1)
    main_ppo.main()
    return 0


if __name__ == "__main__":
    run_program(main)
