"""`entrypoint.py run` end to end on a CPU machine: the real CLI, a stand-in trainer.

Two things this machine lacks are supplied, and nothing else is changed:
- an accelerator: DRIVER runs recipe.cli.main in a fresh process after making the device
  detection report TEST_VISIBLE_DEVICES device nodes (the detection itself still runs);
- the trainer's framework (vLLM, ...): `run` checks its packages are importable; DRIVER
  says they are. The trainer itself is replaced through the product's one test hook,
  RECIPE_TEST_TRAINER (recipe.run.trainer._run_trainer): STAND_IN below, which records the argv and
  environment `run` gave it, and then does what the test asks (exit with a code, write a
  verl-layout checkpoint, the metrics verl's file logger writes, wait for a signal).
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from .envtools import REPO, entrypoint_env

DRIVER = textwrap.dedent(
    """
    import dataclasses, os, sys
    from recipe import cli, plan
    from recipe.run import preflight

    detect = plan.detect_device

    def detect_with_devices(*args, **kwargs):
        found = detect(*args, **kwargs)
        return dataclasses.replace(found, visible_devices=int(os.environ["TEST_VISIBLE_DEVICES"]))

    plan.detect_device = detect_with_devices
    preflight._importable = lambda module: True
    sys.exit(cli.main(sys.argv[1:]))
    """
)

STAND_IN = textwrap.dedent(
    """
    import json, os, shutil, signal, sys, time
    argv = sys.argv[1:]
    with open(os.environ["STAND_IN_RECORD"], "w") as record:
        json.dump({"argv": argv, "env": dict(os.environ)}, record)
    mode = os.environ.get("STAND_IN_MODE", "exit")
    if os.environ.get("STAND_IN_METRICS"):
        # What verl's file logger writes (PROFILE=smoke plans it): the step metrics of a recorded run.
        shutil.copyfile(os.environ["STAND_IN_METRICS"], os.environ["VERL_FILE_LOGGER_PATH"])
    if mode == "save":
        # What verl writes at a save (checkpoint layout v2), under the default_local_dir it was given.
        value = [a for a in argv if a.startswith("trainer.default_local_dir=")][-1].split("=", 1)[1]
        actor = os.path.join(value.strip("'"), "global_step_3", "actor")
        if os.environ.get("STAND_IN_EXPORT"):  # unset: a save without an HF export
            shutil.copytree(os.environ["STAND_IN_EXPORT"], os.path.join(actor, "model", "huggingface"))
        os.makedirs(actor, exist_ok=True)
        open(os.path.join(actor, "ckpt_contents.json"), "w").write("{}")
    if mode == "tensorboard":
        # Two steps into the TENSORBOARD_DIR the plan gave it, written as verl 0.9.1's adapter writes them
        # (verl/utils/tracking.py _TensorboardAdapter: torch's SummaryWriter, one scalar per metric at the step).
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(os.environ["TENSORBOARD_DIR"])
        for step, reward in ((1, 0.5), (2, 0.75)):
            for key, value in {"critic/rewards/mean": reward, "timing_s/step": 1.0}.items():
                writer.add_scalar(key, value, step)
        writer.close()
    if mode == "verl_steps":
        # The steps a real run logged (tests/unit/verl_steps.json), through verl 0.9.1's own TensorBoard adapter, into
        # the TENSORBOARD_DIR the plan gave it.
        from verl.utils.tracking import _TensorboardAdapter
        adapter = _TensorboardAdapter("p", "e")
        with open(os.environ["STAND_IN_STEPS"]) as recorded:
            for step, values in json.load(recorded)["steps"].items():
                adapter.log(values, step=int(step))
        adapter.finish()
    if mode == "wait":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(43))
        signal.signal(signal.SIGINT, lambda *_: sys.exit(44))
        print("stand-in ready", flush=True)
        time.sleep(3600)
    sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
    """
)


def layout_of_one(**settings: str) -> dict[str, str]:
    """Settings of a one-device gpu run (a plain CPU machine stands in for it)."""
    return {"DEVICE": "gpu", "NDEVICES_PER_NODE": "1", "TP": "1", "PP": "1", "CP": "1", "EP": "1", "ETP": "1",
            "GEN_TP": "1", **settings}


def run_environment(tmp: Path, model_path: Path, **settings: str) -> dict[str, str]:
    """Environment of `run` with the stand-in trainer: data files, checkpoints under `tmp`."""
    stand_in = tmp / "stand_in.py"
    stand_in.write_text(STAND_IN)
    for name in ("train.parquet", "test.parquet"):
        (tmp / name).touch()
    values = {
        "MODEL_PATH": str(model_path),
        "TRAIN_FILES": str(tmp / "train.parquet"),
        "VAL_FILES": str(tmp / "test.parquet"),
        "CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "PROJECT_NAME": "p",
        "EXPERIMENT_NAME": "e",
        **settings,
    }
    env = entrypoint_env(**values)
    env |= {
        "RECIPE_TEST_TRAINER": shlex.join([sys.executable, str(stand_in)]),
        "STAND_IN_RECORD": str(tmp / "record.json"),
        "TEST_VISIBLE_DEVICES": "1",
        # This tree's recipe, also in a copy of the repository (the mutation check runs there).
        "PYTHONPATH": str(REPO),
    }
    return env


def cli(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process on a machine with the devices and packages `run` checks for."""
    return subprocess.run([sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def start_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """As cli(), but started and left running; stdout is a pipe."""
    return subprocess.Popen([sys.executable, "-c", DRIVER, *args], env=env, stdout=subprocess.PIPE, text=True)


def recorded(tmp: Path) -> dict[str, Any] | None:
    """What the stand-in trainer was given, or None when it never ran."""
    path = tmp / "record.json"
    return json.loads(path.read_text()) if path.is_file() else None


class PipedStdout(io.StringIO):
    """stdout as `docker logs` or a CI job sees it (a pipe, block-buffered): what is written but not yet flushed."""

    def __init__(self) -> None:
        super().__init__()
        self.unflushed = ""

    def write(self, text: str) -> int:
        self.unflushed += text
        return super().write(text)

    def flush(self) -> None:
        self.unflushed = ""
        super().flush()

    def isatty(self) -> bool:
        return False
