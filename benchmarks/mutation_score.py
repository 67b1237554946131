#!/usr/bin/env python3
"""mutmut's mutation score of some recipe modules against their unit tests: a benchmark, not a gate.

tests/mutations/check.py is the gate (named breakages CI must catch). This asks mutmut
(`pip install mutmut==3.8.1`, the release measured; not in the test extra, as CI does not run
this) to make every small mutation of each module below, runs the
module's own unit tests against each, and prints killed / all and the time per module. A survived mutant
is a change no test notices; a "no tests" one is code those tests never reach.

    python benchmarks/mutation_score.py [MODULE ...]      # e.g. layout allocator

Each module runs in a throw-away copy of the repository (mutmut rewrites files); about a
minute per module on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: module under recipe/ -> the unit tests that are meant to pin it down (every module; `--list` prints them).
U, E, D, S = "tests/unit", "tests/unit/export", "tests/unit/data", "tests/unit/smoke"
MODULES = {
    "__main__": [f"{U}/test_help.py"],
    "allocator": [f"{U}/test_allocator.py"],
    "checkpoint_tracker": [f"{E}/test_checkpoint_tracker.py", f"{E}/test_resume_guard_hostile.py"],
    "chip": [f"{U}/test_chip.py", f"{U}/test_chip_sources.py"],
    "cli": [f"{U}/test_cli.py", f"{U}/test_cli_inprocess.py", f"{U}/test_cli_help_contract.py"],
    # test_hostile_settings.py checks these rules too, but one of its tests runs the entrypoint from another
    # folder, which fails inside mutmut's copy (mutmut 3.8.1); it is left out of the selection.
    "cluster/rules": [f"{U}/cluster/test_rules.py", f"{U}/test_layout.py"],
    "cluster/node_watch": [f"{U}/cluster/test_node_watch.py"],
    "cluster/ray_node": [f"{U}/cluster/test_ray_node.py"],
    # The Ray half: tests/unit/cluster/test_with_real_ray.py runs real Ray, too slow per mutant.
    "cluster/readiness": [f"{U}/cluster/test_readiness.py"],
    "cluster/supervisors": [f"{U}/cluster/test_supervisors.py"],
    # A fake Ray (test_with_real_ray.py, real Ray on loopback, runs past 30 min per mutant set; it stays, as only real
    # Ray shows that a node's task reads that node's own root).
    "cluster/shared_storage": [f"{U}/cluster/test_shared_storage.py"],
    "atomic": [f"{U}/test_atomic.py", f"{U}/test_atomic_cleanup.py"],
    "data/command": [f"{D}/test_command.py", f"{D}/test_command_parser_and_handler.py"],
    "data/errors": [f"{D}/test_command.py"],
    # The end-to-end batteries (test_hostile_sources.py, test_prepare.py) ran past 1800 s per module:
    # guard, prepare and source are measured against their direct unit tests.
    "data/guard": [f"{D}/test_guard_rules.py"],
    "data/prepare": [f"{D}/test_prepare_manifest_and_output.py"],
    "data/prompt_lengths": [f"{D}/test_prompt_lengths.py"],
    "data/source": [f"{D}/test_source_loading.py"],
    "data/specs": [f"{D}/test_specs.py", f"{D}/test_hostile_sources.py", f"{D}/test_specs_images.py"],
    "device": [f"{U}/test_device.py", f"{U}/test_device_defaults.py"],
    "digests": [f"{E}/test_digests.py", f"{E}/test_provenance.py"],
    # test_doctor.py and test_doctor_runner.py run the entrypoint and real probes in subprocesses (mutmut cannot
    # see what they reach, and they are slow): the doctor modules are measured against direct-call tests.
    "doctor/checks": [f"{U}/test_doctor_checks.py"],
    "doctor/trainer_imports": [f"{U}/test_doctor_checks.py"],
    "doctor/command": [f"{U}/test_doctor_command.py"],
    "doctor/facts": [f"{U}/test_doctor_facts.py"],
    "doctor/probe": [f"{U}/test_doctor_steps.py"],
    "doctor/device_steps": [f"{U}/test_doctor_steps.py"],
    "doctor/probe_events": [f"{U}/test_doctor_steps.py"],
    "doctor/runner": [f"{U}/test_doctor_probes.py"],
    "env_names": [f"{U}/test_env_names.py", f"{U}/test_env_names_commands.py"],
    "errors": [f"{U}/test_errors.py"],
    "export/bridge_export": [f"{E}/test_bridge_export_inputs.py", f"{E}/test_bridge_export_world.py", f"{E}/test_bridge_export_steps.py"],
    "export/commands": [f"{E}/test_commands_handlers.py", f"{E}/test_commands_help.py"],
    # tests/bridge builds and exports whole models (module fixtures): under mutmut each forked child deadlocked in
    # torch's OpenMP pool, started by the parent's stats run, and timed out; these call cpu_layers directly.
    "export/cpu_layers": ["tests/bridge/test_cpu_layers_norms.py", "tests/bridge/test_cpu_layers_specs.py"],
    "export/expected": [f"{E}/test_expected_model_class.py"],
    "export/hf_check": [f"{E}/test_hf_check_compare.py"],
    "export/jsonsafe": [f"{E}/test_jsonsafe.py", f"{E}/test_jsonsafe_values.py", f"{E}/test_jsonsafe_depth.py",
                        f"{E}/test_jsonsafe_text.py"],
    "export/report": [f"{E}/test_report.py", f"{E}/test_hf_check.py"],
    "export/shards": [f"{E}/test_shards_messages.py"],
    "export/safetensors_header": [f"{E}/test_shards_messages.py"],
    "export/verl_patch": [f"{E}/test_verl_patch.py"],
    "export/evidence": [f"{E}/test_report_evidence.py"],
    "export/watch": [f"{E}/test_watch_sweeps.py"],
    "help": [f"{U}/test_help.py"],
    # test_hostile_settings.py is left out, as for cluster/rules above (it stopped mutmut's stats run).
    "hydra_text": [f"{U}/test_launch.py", f"{U}/test_hydra_text_quoting.py"],
    "import_patch": [f"{E}/test_verl_patch.py", f"{U}/test_mismatch.py"],
    # test_settings_table.py (two plans per setting and target) ran past 1800 s: test_launch_upstream.py checks
    # the same docs table's decided keys from one build per target.
    "launch": [f"{U}/test_launch.py", f"{U}/test_launch_upstream.py"],
    "layout": [f"{U}/test_layout.py"],
    "mismatch": [f"{U}/test_mismatch.py"],
    "health_log": [f"{U}/test_health_log.py"],
    "memory_fit": [f"{U}/test_memory_fit.py", f"{U}/test_memory_fit_terms.py", f"{U}/test_memory_fit_verdicts.py",
                   f"{U}/test_memory_fit_workload.py", f"{U}/test_plan_workload_values.py"],
    "memory_workload": [f"{U}/test_memory_fit_workload.py", f"{U}/test_plan_workload_values.py", f"{U}/test_memory_fit.py"],
    "model_sizes": [f"{U}/test_model_sizes.py", f"{U}/test_model_sizes_edges.py"],
    "models": [f"{U}/test_models.py", f"{U}/test_layout.py", f"{U}/test_models_config_json.py"],
    "own_paths": [f"{U}/test_own_paths.py"],
    "plan": [f"{U}/test_plan_orchestration.py", f"{U}/test_plan_workload_values.py"],
    "plan_warnings": [f"{U}/test_plan_warnings.py", f"{U}/test_routing_replay.py"],
    "routing_replay": [f"{U}/test_routing_replay.py"],
    # Its subprocess tests (the entry points, a pytest of its own) are not traced; the in-process ones are.
    "numbers": [f"{U}/test_read_back_hostile.py"],
    "image_facts": [f"{U}/test_doctor_facts.py"],
    "near_miss": [f"{U}/test_near_miss.py"],
    "config_typos": [f"{U}/test_config_typos.py"],
    "process_exit": [f"{U}/test_process_exit.py"],
    "profiles": [f"{U}/test_bench_profile.py", f"{S}/test_profile.py"],
    "provenance": [f"{E}/test_provenance_record.py", f"{E}/test_provenance_drift.py"],
    "read_back": [f"{U}/test_read_back_hostile.py", f"{E}/test_digests.py"],
    "record_file": [f"{E}/test_record_file.py", f"{E}/test_record_hostile.py"],
    "redaction": [f"{U}/test_secret_in_messages.py", f"{U}/test_user_overrides.py"],
    "run/finish": [f"{U}/test_run_finish.py"],
    "run/preflight": [f"{U}/test_preflight_checks.py"],
    "run/progress": [f"{U}/test_progress.py"],
    "run/report": [f"{U}/test_run_report.py"],
    "run/verl_metrics": [f"{U}/test_run_report.py", f"{U}/test_progress.py"],
    "run/prompt_budget": [f"{D}/test_prompt_lengths.py"],
    "run/resume_guard": [f"{E}/test_resume_guard.py", f"{E}/test_resume_guard_hostile.py"],
    "run/trainer": [f"{U}/test_trainer_supervision.py", f"{U}/test_trainer_run_command.py", f"{U}/test_run_finish.py",
                    f"{U}/test_progress.py"],
    "replay": [f"{E}/test_replay.py", f"{E}/test_replay_hostile.py"],
    "replay_files": [f"{E}/test_replay.py", f"{E}/test_replay_hostile.py"],
    # test_plan_launch_paths.py also runs `entrypoint.py plan` in a subprocess, which mutmut 3.8.1 cannot trace (its
    # first run fails): left out; test_tracker_states.py names every resume mode and total (issue 52).
    "run_length": [f"{U}/test_tracker_states.py", f"{U}/test_progress.py"],
    # test_hostile_settings.py is left out, as for cluster/rules above.
    "settings": [f"{U}/test_settings.py", f"{U}/test_settings_messages.py", f"{U}/test_health_thresholds.py"],
    "settings_messages": [f"{U}/test_settings_messages.py", f"{U}/test_health_thresholds.py"],
    "env_file/bash": [f"{U}/test_env_file_readers.py", f"{U}/test_settings_messages.py"],
    "env_file/compose": [f"{U}/test_env_file_readers.py", f"{U}/test_settings_messages.py"],
    "env_file/judge": [f"{U}/test_env_file_readers.py", f"{U}/test_settings_messages.py"],
    "env_file/reading": [f"{U}/test_env_file_readers.py"],
    "env_warnings": [f"{U}/test_settings.py", f"{U}/test_settings_messages.py", f"{U}/test_env_warnings_edges.py"],
    # Its subprocess tests (a stand-in verl's main run through it) are the only ones: not traced.
    "trainer_main": [f"{U}/test_run_finish.py", f"{U}/test_trainer_main.py"],
    "tracking": [f"{U}/test_tracking.py"],
    "bench/data": [f"{U}/test_bench_profile.py"],
    "bench/profile": [f"{U}/test_bench_profile.py"],
    "smoke/arithmetic": [f"{S}/test_arithmetic.py"],
    # test_prepare.py builds the real tiny model (about 10 s, far more on a loaded machine) for every mutant it reaches.
    "smoke/prepare": [f"{S}/test_prepare_steps.py"],
    "smoke/profile": [f"{S}/test_profile.py"],
    "smoke/reward": [f"{S}/test_reward.py"],
    "smoke/tokenizer": [f"{S}/test_tokenizer.py"],
    "run/health": [f"{U}/test_health.py", f"{U}/test_health_thresholds.py", f"{U}/test_health_log.py"],
    # test_verdict.py judges the real smoke model's export (a 10 s build, then 1-2 s a test): past 20 min under mutmut.
    "smoke/verdict": [f"{S}/test_verdict_rules.py"],
    "user_overrides": [f"{U}/test_user_overrides.py", f"{U}/test_launch.py", f"{U}/test_override_slips.py",
                       f"{U}/test_user_overrides_edges.py"],
    "verl_config": [f"{U}/test_verl_config_check.py", f"{U}/test_verl_config_findings.py"],
    "verl_types": [f"{U}/test_verl_config_check.py", f"{U}/test_verl_config_findings.py", f"{U}/test_override_slips.py"],
    "worker_setup": [f"{U}/test_worker_setup.py"],
}
#: What the tests read besides the code.
ALSO_COPY = ["tests/", "recipe/", "README.md", "pyproject.toml", "docs/", "docker/", "entrypoint.py", "k8s/", ".env.example", "compose.yaml"]


class NotMeasured(Exception):
    """mutmut could not score a module (e.g. its tests reach it only through a subprocess, which mutmut cannot trace)."""


def score(module: str, tests: list[str], survivors: Path | None = None) -> dict[str, int]:
    """mutmut's counts for recipe/MODULE.py against TESTS, from a fresh copy of the repository.

    With `survivors`, the diff of each surviving mutant, and of each that no test reached, is appended
    there (mutmut show), to be killed by a test or listed as equivalent with its reason.
    """
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as folder:  # a killed run's workers may still write
        copy = Path(folder) / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv*", ".git", ".e2e", "__pycache__", "mutants"))
        also = "\n    ".join(ALSO_COPY)
        # A list in setup.cfg is one item per line: space-separated, several test files were one argument.
        selection = "\n    ".join(tests)
        (copy / "setup.cfg").write_text(
            f"[mutmut]\nsource_paths=recipe/{module}.py\n"
            f"pytest_add_cli_args_test_selection=\n    {selection}\nalso_copy={also}\n"
        )
        done = subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=copy, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
            raise NotMeasured(f"mutmut run exited {done.returncode}:\n" + "\n".join(tail))
        results = subprocess.run(
            [sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=copy, capture_output=True, text=True,
            check=True,
        ).stdout
        if survivors is not None:
            with survivors.open("a", encoding="utf-8") as out:
                for line in results.splitlines():
                    name, _, status = line.strip().rpartition(":")
                    if status.strip() in ("survived", "no tests"):  # both are changes no test notices
                        shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name.strip()], cwd=copy,
                                               capture_output=True, text=True, check=False)  # fmt: skip
                        out.write(f"# {name.strip()}\n{shown.stdout}\n")
    counts = {"killed": 0, "survived": 0, "no tests": 0, "timeout": 0, "other": 0}
    for line in results.splitlines():
        status = line.rsplit(":", 1)[-1].strip() if ":" in line else ""
        counts[status if status in counts else "other"] += 1
    return counts


def main() -> int:
    from importlib.util import find_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"some of: {', '.join(MODULES)} (default: all)")
    parser.add_argument("--list", action="store_true", help="print each module and its tests, run nothing")
    parser.add_argument("--survivors", type=Path, metavar="FILE", help="append the diff of every surviving or untested mutant to FILE")
    args = parser.parse_args()
    if args.list:
        for module, tests in MODULES.items():
            print(f"recipe/{module}.py: {' '.join(tests)}")
        return 0
    if find_spec("mutmut") is None:
        print("error: mutmut is not installed: pip install mutmut==3.8.1", file=sys.stderr)
        return 2
    totals: dict[str, int] = {}
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}: choose from {', '.join(MODULES)}")
    for module in args.modules or list(MODULES):
        began = time.monotonic()
        try:
            counts = score(module, MODULES[module], args.survivors)
        except subprocess.TimeoutExpired as expired:
            print(f"recipe/{module}.py: not measured: mutmut ran past {expired.timeout:.0f} s", flush=True)
            continue
        except NotMeasured as why:
            print(f"recipe/{module}.py: not measured: {why}", flush=True)
            continue
        seconds = time.monotonic() - began
        total = sum(counts.values())
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        print(f"recipe/{module}.py: {counts['killed']}/{total} killed ({counts['killed'] / max(total, 1):.0%}) "
              f"in {seconds:.0f} s; " + json.dumps({k: v for k, v in counts.items() if k != 'killed'}), flush=True)
    total = sum(totals.values())
    print(f"all: {totals.get('killed', 0)}/{total} killed ({totals.get('killed', 0) / max(total, 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
