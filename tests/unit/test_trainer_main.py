"""recipe.trainer_main: verl's TaskRunner is placed on Ray's head node, where the run's driver and `run` live."""

from __future__ import annotations

from typing import Any

import pytest

from recipe import trainer_main
from recipe.trainer_main import ON_THE_HEAD, OnTheHead


class Recording:
    """Stands in for a Ray actor class: records the options each start asked for."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    def options(self, **options: Any) -> Recording:
        self.asked.append(options)
        return self

    def remote(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return args, kwargs


def test_a_plain_start_asks_for_the_head_nodes_resource() -> None:
    actor = Recording()
    assert OnTheHead(actor).remote(1, key=2) == ((1,), {"key": 2})
    assert actor.asked == [{"resources": ON_THE_HEAD}]


def test_options_of_the_caller_are_kept_and_its_resources_joined() -> None:
    """verl's profiling path starts it with .options(runtime_env=...): kept, the head's resource added."""
    actor = Recording()
    OnTheHead(actor).options(runtime_env={"nsight": {}}, resources={"custom": 1})
    assert actor.asked == [{"runtime_env": {"nsight": {}}, "resources": {"custom": 1, **ON_THE_HEAD}}]


def test_ray_accepts_the_options() -> None:
    """Ray validates actor options when they are given: the head's resource is one it takes."""
    ray = pytest.importorskip("ray", reason="Ray is in the test venv (tests/setup.sh) and the images")

    @ray.remote
    class Actor:
        pass

    assert hasattr(OnTheHead(Actor).options(num_cpus=0), "remote")


def test_main_starts_verl_with_the_task_runner_on_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The class verl's main starts is the one wrapped, read from verl's module when the run starts."""
    main_ppo = pytest.importorskip("verl.trainer.main_ppo", reason="verl is in the test venv (tests/setup.sh)")
    original, seen = main_ppo.TaskRunnerV1, []
    monkeypatch.setattr(main_ppo, "main", lambda: seen.append(main_ppo.TaskRunnerV1))
    monkeypatch.setattr(main_ppo, "TaskRunnerV1", original)
    assert trainer_main.main() == 0
    assert len(seen) == 1 and isinstance(seen[0], OnTheHead) and seen[0].actor_class is original
