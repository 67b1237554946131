"""GRPO across two Ray nodes through the recipe's own bootstrap: two `entrypoint.py run`, as two machines start them.

The module's runs (tests/e2e/harness/nodes.py): the smoke profile's plan (images in the data) for NNODES=2, one
device per node, each node on its own loopback address, started as two `entrypoint.py run` processes at once:
rank 0 starts the Ray head, waits for rank 1, checks that both see the checkpoint root, and runs the trainer;
rank 1 joins and stays until the head is gone.

1. Uninterrupted: two GRPO steps, a save after each with its Hugging Face export, `run`'s own smoke verdict. Where
   each actor ran is read from Ray's own state (the GCS actor table) while the run goes on; peak memory is that
   of every process of both nodes together. Step 1 trains on the batch the one-node e2e's first run trained on
   (verl's rollout skip, tests/e2e/harness/step_batch.py): its save must hold the same update, to the rounding of
   sums added in another order.
2. Then the same run, as a restart policy meets it after a loss in step 2: its tracker back at step 1 and step 2's
   save gone (kept aside as the uninterrupted run's), and
   - a worker lost inside a collective: once the worker's Megatron rank runs the actor update it is held there
     (SIGSTOP) until the head's rank waits for it in a collective (py-spy shows it), then every process of the
     worker is killed at once; the head's `run` must end within the documented bound
     (recipe.cluster.rules.lost_node_bound_s), exit 3, one line naming the node;
   - a head lost: restarted, the head is killed as soon as its trainer started; the worker's `run` must end
     within its bound (lost_head_bound_s), exit 3, one line naming the head (the next restart starts meanwhile:
     the worker's wait is its own clock);
   - restarted again, this time as KubeRay's RayJob retries a run (tests/e2e/harness/rayjob.py): a new cluster
     from the rendered gpu-ray overlay (two raylets from its rayStartParams and pods' environment) and its
     entrypoint, `entrypoint.py run`, once as the driver; the run resumes from step 1, trains step 2, passes its
     verdict, and its exported weights equal the uninterrupted run's, bit for bit (the one-node e2e's resume is
     bit-exact too: same seeds, same batch, same order of reductions on the same two ranks).
Tests only read what the runs left.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from recipe.checkpoint_tracker import TRACKER_NAME
from recipe.cluster.rules import lost_head_bound_s, lost_node_bound_s
from recipe.launch import METRICS_FILE
from tests.e2e.conftest import PHASES, STEP_1_BATCH, WORK, _check_environment, _fresh
from tests.e2e.harness.assets import build_assets
from tests.e2e.harness.nodes import (
    HEAD_IP,
    WORKER_IP,
    ActorObserver,
    Cluster,
    Node,
    kill_node,
    new_cluster,
    hold_inside_update,
    inside_collective,
    start_node,
    wait_until,
)
from tests.e2e.harness.plan import RUN_OVERRIDES, STEPS, recipe_settings
from tests.e2e.harness.rayjob import RenderedRayJob, render_rayjob, start_rayjob
from tests.e2e.harness.step_batch import LOADED, WROTE, batch_overrides, update_gap, written_batch

if TYPE_CHECKING:  # its module imports tests.e2e.cpu's patches: loaded only where a run is read (tests/deploy imports us)
    from tests.e2e.harness.checkpoint import OptimizerState

#: Deadline of a whole two-node run (both nodes' start, two steps, the saves, the verdict).
RUN_TIMEOUT_S = 900.0
#: The issue's memory bound for the two-node runs on CI's 24 GiB machine: every process of both nodes together.
MEMORY_LIMIT_BYTES = 16 << 30
#: RAY_WAIT_TIMEOUT of both nodes: the head's wait for the worker (which joins in about 10 s here), and the worker's
#: wait for a restarted head once the head is gone.
REJOIN_GRACE_S = 30
#: How long the worker may take to end once the head is gone (recipe.cluster.rules.lost_head_bound_s).
WORKER_END_S = lost_head_bound_s(REJOIN_GRACE_S)
PROJECT, EXPERIMENT = "grpo_recipe_smoke", "qwen3_5_moe_tiny"  # the smoke profile's tracking names
#: The one-node e2e's first run: its log and its step-1 save (tests/e2e/conftest.py, `e2e`).
ONE_NODE_LOG = WORK / "run" / "first.log"
ONE_NODE_STEP_1 = WORK / "run" / "checkpoints" / PROJECT / EXPERIMENT / "global_step_1"


def node_overrides() -> list[str]:
    """The `--` overrides of every start (the restarts' must be the first's): the run's, and verl's rollout skip
    of step 1 (it loads the one-node run's batch when that is there, writes its own otherwise)."""
    return [*RUN_OVERRIDES, *batch_overrides(STEP_1_BATCH)]


def one_node_batch_written() -> bool:
    """Whether the one-node e2e's first run wrote step 1's batch in this work folder, beside its step-1 save."""
    log = ONE_NODE_LOG.read_text(errors="replace") if ONE_NODE_LOG.is_file() else ""
    return WROTE in log and bool(written_batch(STEP_1_BATCH)) and ONE_NODE_STEP_1.is_dir()


@dataclass(frozen=True)
class Attempt:
    """One start of both nodes: their exit codes, logs and how long each took to end after a loss."""

    head: Node
    worker: Node
    head_code: int | None
    worker_code: int | None
    ended_after_loss_s: float | None = None
    stack: str = ""


@dataclass(frozen=True)
class TwoNodeRun:
    """The uninterrupted run: what it left, read once it ended (the restarts reuse its checkpoint root)."""

    attempt: Attempt
    state: dict[str, Any]
    steps_logged: list[int]
    export_step: int | None
    export_status: str | None
    report_status: str | None
    weights: Path
    peak_memory_bytes: int
    #: Whether the one-node run's step-1 batch was there to train on (one_node_batch_written), and step 1's save.
    trained_the_one_node_batch: bool
    step_1_optimizer: OptimizerState | None


@dataclass
class LostNodes:
    """The restarts after a loss in step 2: the worker lost, the head lost, then the run to its end."""

    worker_lost: Attempt
    head_lost: Attempt
    #: The RayJob's retry: its driver as the head (its log is the run's), the worker's raylet as the worker.
    resumed: Attempt
    rayjob: RenderedRayJob
    rayjob_settings: dict[str, str]
    root: Path
    peak_memory_bytes: int = 0


def _peak_memory(nodes: list[Node], stop: threading.Event, peak: list[int]) -> None:
    from tests.e2e.harness.trainer import _memory

    while not stop.wait(1.0):
        peak[0] = max(peak[0], sum(_memory(node.processes()) for node in nodes))


def _wait(process: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


class Nodes:
    """Both nodes of one start, their memory sampled until `done`; every node ever started is killed at the module's
    end (ALL), so that a node still winding down (a worker waiting for its head) overlaps the next start.

    Two `entrypoint.py run` (Compose's path), or with `rayjob` KubeRay's: two raylets and the driver."""

    ALL: list[Node] = []

    def __init__(self, cluster: Cluster, run_dir: Path, name: str, rayjob: RenderedRayJob | None = None) -> None:
        if rayjob is None:
            self.head = start_node(cluster, 0, node_overrides(), run_dir / f"{name}-head.log")
            self.worker = start_node(cluster, 1, node_overrides(), run_dir / f"{name}-worker.log")
            started = [self.head, self.worker]
        else:
            head_raylet, self.worker, self.head = start_rayjob(rayjob, cluster, run_dir, name)
            started = [head_raylet, self.worker, self.head]
        Nodes.ALL += started
        self.stop, self.peak = threading.Event(), [0]
        threading.Thread(target=_peak_memory, args=(started, self.stop, self.peak), daemon=True).start()

    def done(self) -> int:
        """Stop sampling; the peak memory of both nodes' processes together."""
        self.stop.set()
        return self.peak[0]

    @classmethod
    def kill_all(cls) -> None:
        for node in cls.ALL:
            kill_node(node)
        cls.ALL.clear()


def _cluster(checkpoint_dir: Path) -> Cluster:
    """Settings of both nodes: a save after each step; a short RAY_WAIT_TIMEOUT, so that the worker ends soon."""
    return new_cluster({**recipe_settings(checkpoint_dir, save_freq=1), "RAY_WAIT_TIMEOUT": str(REJOIN_GRACE_S)})


def rayjob_settings(cluster: Cluster) -> dict[str, str]:
    """What the user writes into k8s/base/settings.env for the same run: the run's settings, one device a node, and
    the overrides in OVERRIDES (a RayJob's entrypoint has no `--`). Not NNODES (the overlay's, beside its replicas),
    not Ray's token (KubeRay's)."""
    return {**cluster.settings, "NDEVICES_PER_NODE": "1", "OVERRIDES": " ".join(node_overrides())}


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodeRun]:
    from recipe.export.evidence import trusted_status
    from recipe.export.hf_check import verify_export
    from recipe.export.watch import REPORT_NAME, latest_hf_export
    from tests.e2e.harness.checkpoint import optimizer_state

    _check_environment()
    started = time.monotonic()
    run_dir = _fresh(WORK / "two-nodes")
    checkpoint_dir = run_dir / "checkpoints"
    build_assets(checkpoint_dir)  # where `run` builds them: both nodes find them built and reuse them
    one_node_batch = one_node_batch_written()
    cluster = _cluster(checkpoint_dir)
    try:
        nodes = Nodes(cluster, run_dir, "uninterrupted")
        observer = ActorObserver(cluster, run_dir / "actors.json", run_dir / "observer.log")
        try:
            head_code = _wait(nodes.head.process, RUN_TIMEOUT_S)
        finally:
            state = observer.stop()
        peak = nodes.done()
        # The worker ends on its own once its head is gone (REJOIN_GRACE_S later): the restarts start meanwhile.
        PHASES.timed("two nodes: uninterrupted, two steps, two saves, verdict", started)
        PHASES.peak_memory_bytes = max(PHASES.peak_memory_bytes, peak)
        root = checkpoint_dir / PROJECT / EXPERIMENT
        metrics = root / METRICS_FILE
        steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        export = latest_hf_export(root)
        weights = run_dir / "uninterrupted-export"
        status = report = None
        step_1 = optimizer_state(root / "global_step_1") if (root / "global_step_1").is_dir() else None
        if export is not None:
            status = verify_export(export.directory).status
            report = trusted_status(export.directory.parent / REPORT_NAME, export.step, export.step_dir,
                                    export.directory)  # fmt: skip
            shutil.copytree(export.directory, weights)
        yield TwoNodeRun(Attempt(nodes.head, nodes.worker, head_code, None), state, steps,
                         export.step if export else None, status, report, weights, peak, one_node_batch,
                         step_1)  # fmt: skip
    finally:
        Nodes.kill_all()


def _back_to_step_1(root: Path) -> None:
    """The checkpoint root as a loss in step 2 leaves it: the tracker at step 1, step 2 never saved."""
    shutil.rmtree(root / f"global_step_{STEPS}")
    (root / TRACKER_NAME).write_text("1")


def _worker_lost_inside_a_collective(checkpoint_dir: Path, run_dir: Path) -> tuple[Attempt, int]:
    nodes = Nodes(_cluster(checkpoint_dir), run_dir, "worker-lost")
    stack = hold_inside_update(nodes.head, nodes.worker, RUN_TIMEOUT_S) or ""
    lost = time.monotonic()
    kill_node(nodes.worker, clean=False)
    head_code = _wait(nodes.head.process, lost_node_bound_s() + 60)
    ended = time.monotonic() - lost
    return Attempt(nodes.head, nodes.worker, head_code, None, ended, stack), nodes.done()


@pytest.fixture(scope="module")
def lost_nodes(two_nodes: TwoNodeRun) -> Iterator[LostNodes]:
    run_dir = WORK / "two-nodes"
    checkpoint_dir = run_dir / "checkpoints"
    root = checkpoint_dir / PROJECT / EXPERIMENT
    if two_nodes.attempt.head_code != 0 or not (root / "global_step_1").is_dir():
        pytest.fail("the uninterrupted two-node run did not finish with a save at step 1: nothing to restart from")
    _back_to_step_1(root)
    started = time.monotonic()
    worker_lost, peak_worker = _worker_lost_inside_a_collective(checkpoint_dir, run_dir)
    PHASES.timed("two nodes: worker lost in step 2's update", started)
    PHASES.notes.append(f"worker lost: the head's `run` ended with exit {worker_lost.head_code} "
                        f"{worker_lost.ended_after_loss_s:.0f} s after the kill (bound {lost_node_bound_s():.0f} s)")
    started = time.monotonic()
    head_lost = Nodes(_cluster(checkpoint_dir), run_dir, "head-lost")
    # Once its trainer started: both nodes joined, the run under way.
    wait_until(lambda: "Executing: " in head_lost.head.text(), RUN_TIMEOUT_S)
    lost = time.monotonic()
    kill_node(head_lost.head, clean=False)
    # The restart starts while the worker waits for its head (on another port): the wait is the worker's clock.
    # This time as KubeRay retries a RayJob: a new cluster from the rendered overlay, the entrypoint its driver.
    cluster = _cluster(checkpoint_dir)
    settings = rayjob_settings(cluster)
    rayjob = render_rayjob(settings, run_dir)
    resumed = Nodes(cluster, run_dir, "resumed", rayjob)
    worker_code = _wait(head_lost.worker.process, WORKER_END_S + 60)
    ended = time.monotonic() - lost
    peak_head = head_lost.done()
    PHASES.timed("two nodes: head lost (the restart starting meanwhile)", started)
    PHASES.notes.append(f"head lost: the worker's `run` ended with exit {worker_code} {ended:.0f} s after the kill "
                        f"(bound {WORKER_END_S:.0f} s)")
    started = time.monotonic()
    head_code = _wait(resumed.head.process, RUN_TIMEOUT_S)
    worker_code_resumed = resumed.worker.process.poll()  # None: the worker's raylet served the run to its end
    PHASES.timed("two nodes: restarted as a RayJob, resumed, step 2, verdict", started)
    peak = max(peak_worker, peak_head, resumed.done())
    PHASES.peak_memory_bytes = max(PHASES.peak_memory_bytes, peak)
    yield LostNodes(worker_lost, Attempt(head_lost.head, head_lost.worker, None, worker_code, ended),
                    Attempt(resumed.head, resumed.worker, head_code, worker_code_resumed), rayjob, settings, root,
                    peak)  # fmt: skip


# --- the uninterrupted run -------------------------------------------------------------------------------------


def test_the_head_trains_saves_and_passes_the_smoke_verdict(two_nodes: TwoNodeRun) -> None:
    text = two_nodes.attempt.head.text()
    assert two_nodes.attempt.head_code == 0, text[-6000:]
    assert "smoke: PASS" in text, text[-6000:]


def test_the_heads_progress_lines_show_the_mismatch_in_both_units_and_the_capped_share(two_nodes: TwoNodeRun) -> None:
    """Issue 53, through `run`'s own reading of verl's event files: the recipe's per-token gap (computed in verl's
    workers by the recipe's hook) reaches the progress line of each step beside verl's KL and the capped share."""
    number = r"-?[\d.]+(?:e-?\d+)?"
    shown = re.compile(rf"KL {number} \(bound 0\.002\), \|Δlog p\| {number} \(bound 0\.1\), capped {number} %")
    lines = [line for line in two_nodes.attempt.head.text().splitlines() if line.startswith("progress: step ")]
    assert len(lines) == STEPS and all(shown.search(line) for line in lines), lines


def test_the_worker_joined_and_ends_with_the_run(two_nodes: TwoNodeRun, lost_nodes: LostNodes) -> None:
    """Rank 1 joins the head and, once the head is gone past the rejoin grace, ends with 0: the head's run report,
    written while it was joined, says the run finished. (Asked after the restarts: it ended meanwhile.)"""
    worker = two_nodes.attempt.worker
    text = worker.text()
    assert _wait(worker.process, WORKER_END_S) == 0, text[-4000:]
    assert "the run is over (the head's run report (run-report.json) says it finished with exit 0)" in text, text[-4000:]


def test_two_grpo_steps_ran(two_nodes: TwoNodeRun) -> None:
    assert two_nodes.steps_logged == list(range(1, STEPS + 1))


def _nodes_of(state: dict[str, Any], *names: str) -> dict[str, set[str]]:
    """{actor class: the node addresses its actors ran on} for every class whose name holds one of `names`."""
    found: dict[str, set[str]] = {}
    for actor in state["actors"].values():
        if any(name in actor["class"] for name in names):
            found.setdefault(actor["class"], set()).add(actor["node_ip"])
    return found


def test_ray_shows_the_training_ranks_and_the_rollout_replicas_on_both_nodes(two_nodes: TwoNodeRun) -> None:
    """From Ray's own state, not assumed: both nodes registered, and the actor's Megatron ranks and vLLM's rollout
    replicas ran on each of them."""
    state = two_nodes.state
    assert sorted(state["nodes"].values()) == [HEAD_IP, WORKER_IP], state["nodes"]
    classes = sorted({actor["class"] for actor in state["actors"].values()})
    ranks = _nodes_of(state, "WorkerDict")
    replicas = _nodes_of(state, "vLLM", "Server")
    assert ranks and all(ips == {HEAD_IP, WORKER_IP} for ips in ranks.values()), (ranks, classes)
    assert any(ips == {HEAD_IP, WORKER_IP} for ips in replicas.values()), (replicas, classes)


def test_verls_task_runner_ran_on_the_head(two_nodes: TwoNodeRun) -> None:
    """recipe.trainer_main places it there (Ray left to itself put it on the worker): a lost worker never takes
    the run's driver with it."""
    assert _nodes_of(two_nodes.state, "TaskRunner") == {"TaskRunnerV1": {HEAD_IP}}


def test_step_1_on_two_nodes_is_the_update_one_node_made_of_the_same_batch(two_nodes: TwoNodeRun) -> None:
    """The same batch (the one-node run's, loaded by verl) and the same weights give the same update on two ranks,
    one a node, as on one: Adam's moments and the fp32 weights of both step-1 saves, within the rounding of sums
    added in another order (tests/e2e/harness/step_batch.py says why 1e-5)."""
    if not two_nodes.trained_the_one_node_batch:
        pytest.skip("no step-1 batch of the one-node e2e in this work folder: run tests/e2e before this module (as "
                    ".ci/run does); its first run writes the batch this compares on")
    from tests.e2e.harness.checkpoint import optimizer_state

    assert LOADED in two_nodes.attempt.head.text(), two_nodes.attempt.head.text()[-6000:]
    assert two_nodes.step_1_optimizer is not None
    gap = update_gap(optimizer_state(ONE_NODE_STEP_1), two_nodes.step_1_optimizer)
    PHASES.notes.append(f"step 1, one node against two: gradient {gap.gradient:.1e}, squared gradient "
                        f"{gap.squared_gradient:.1e} relative, weights {gap.weights_in_steps:.1e} lr steps (RMS)")
    assert gap.within(), gap


def test_the_export_both_nodes_wrote_passes_its_check(two_nodes: TwoNodeRun) -> None:
    """The HF export of step 2, gathered from the ranks of both nodes: checked, and the watcher's report of it
    (written by the head's `run`) counts, its evidence matching the export."""
    assert two_nodes.export_step == STEPS
    assert two_nodes.export_status in ("complete", "lenient")
    assert two_nodes.report_status in ("complete", "lenient")


def test_both_nodes_together_stay_under_16_gib(two_nodes: TwoNodeRun, lost_nodes: LostNodes) -> None:
    for peak in (two_nodes.peak_memory_bytes, lost_nodes.peak_memory_bytes):
        assert 0 < peak < MEMORY_LIMIT_BYTES, peak


# --- a lost worker, a lost head, and the restart that resumes ---------------------------------------------------


def test_the_worker_was_killed_while_the_heads_rank_was_inside_a_collective(lost_nodes: LostNodes) -> None:
    stack = lost_nodes.worker_lost.stack
    assert inside_collective(stack), stack or lost_nodes.worker_lost.head.text()[-4000:]


def test_a_lost_worker_ends_the_heads_run_within_its_bound_with_one_line(lost_nodes: LostNodes) -> None:
    attempt = lost_nodes.worker_lost
    text = attempt.head.text()
    assert attempt.head_code == 3, text[-6000:]
    assert attempt.ended_after_loss_s is not None and attempt.ended_after_loss_s < lost_node_bound_s(), attempt
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and WORKER_IP in errors[0], errors
    assert "left the Ray cluster while the trainer ran" in errors[0] and "resumes from its last save" in errors[0]
    assert text.rstrip().splitlines()[-1] == errors[0], text[-3000:]  # the last word: no traceback after it


def test_a_lost_head_ends_the_workers_run_within_its_bound_with_one_line(lost_nodes: LostNodes) -> None:
    attempt = lost_nodes.head_lost
    text = attempt.worker.text()
    assert attempt.worker_code == 3, text[-4000:]
    assert attempt.ended_after_loss_s is not None and attempt.ended_after_loss_s < WORKER_END_S, attempt
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert errors == [text.rstrip().splitlines()[-1]], text[-3000:]
    assert f"the Ray head at {HEAD_IP}:" in errors[0] and "left before the run finished" in errors[0], errors


def test_the_restart_ran_the_rendered_rayjob(lost_nodes: LostNodes) -> None:
    """KubeRay's path as rendered: the entrypoint the RayJob names, the settings the user wrote reaching the pods,
    NNODES the overlay's and 1 + its worker replicas, and the driver joining the cluster both raylets formed."""
    rayjob = lost_nodes.rayjob
    assert rayjob.entrypoint == ["python3", "/opt/recipe/entrypoint.py", "run"]
    for env in (rayjob.head_env, rayjob.worker_env):
        assert {name: env.get(name) for name in lost_nodes.rayjob_settings} == lost_nodes.rayjob_settings
        assert env.get("NNODES") == str(1 + rayjob.worker_replicas) == "2"
    text = lost_nodes.resumed.head.text()
    assert f"Ray: RAY_ADDRESS={HEAD_IP}:" in text and "is set: join that cluster" in text, text[-6000:]
    [ready] = [line for line in text.splitlines() if "Ray cluster ready: " in line]
    assert HEAD_IP in ready and WORKER_IP in ready, ready


def test_the_restarted_run_resumes_from_step_1_and_passes_its_verdict(lost_nodes: LostNodes) -> None:
    attempt = lost_nodes.resumed
    text = attempt.head.text()
    assert attempt.head_code == 0, text[-6000:]
    assert "smoke: PASS" in text and "1 of 1 logged (resumed after step 1)" in text, text[-6000:]
    assert attempt.worker_code is None, attempt.worker.text()[-4000:]  # its raylet up to the end
    steps = [json.loads(line)["step"] for line in (lost_nodes.root / METRICS_FILE).read_text().splitlines()]
    assert steps == [STEPS]


def test_the_restarted_runs_weights_equal_the_uninterrupted_runs(two_nodes: TwoNodeRun, lost_nodes: LostNodes) -> None:
    """Bit for bit: every tensor of step 2's HF export."""
    from safetensors.torch import load_file

    from recipe.export.watch import latest_hf_export

    export = latest_hf_export(lost_nodes.root)
    assert export is not None and export.step == STEPS
    theirs = sorted(two_nodes.weights.glob("*.safetensors"))
    ours = sorted(export.directory.glob("*.safetensors"))
    assert [path.name for path in ours] == [path.name for path in theirs] and ours
    different = []
    for mine, reference in zip(ours, theirs):
        a, b = load_file(mine), load_file(reference)
        assert a.keys() == b.keys()
        different += [name for name in a if not (a[name].dtype == b[name].dtype and a[name].equal(b[name]))]
    assert different == [], different[:10]
