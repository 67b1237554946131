"""The mutation check: named breakages of the product that the test suite must catch.

Each breakage is applied to a throw-away copy of the repository (without .venv and .git),
then only the tests named for it run there, and they must FAIL. A breakage whose text no
longer appears exactly once in its file is a failure of this check too: after a refactor,
update the breakage (keep its intent), never drop it silently. First, a control run: the
same tests on the unbroken copy must pass, so a failure below is the breakage's doing.

    python tests/mutations/check.py            # all; exit 1 if any breakage survives
    python tests/mutations/check.py --list     # names and files
    python tests/mutations/check.py resume-guard-removed exit-3-becomes-1

Runs with this interpreter (the project's venv); the copy's own `recipe` is imported
(PYTHONPATH, ahead of an editable install), and CI=true as in CI, so a skip counts as a
failure of the control run. The issue this answers: tests that broke nothing when the code
was broken on purpose (issue 16 of the project's tracker).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COPY_IGNORES = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis", "*.egg-info", ".ruff_cache",
    ".venv-e2e", ".e2e",  # the CPU e2e run's 4 GB venv and its outputs (tests/e2e)
)


@dataclass(frozen=True)
class Breakage:
    """Replace `old` (exactly once in `path`) by `new`: `tests` must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


UNIT = "tests/unit"
RUN = f"{UNIT}/test_run_command.py"
RUN_CHECKS = f"{UNIT}/export/test_run_checks.py"

BREAKAGES: tuple[Breakage, ...] = (
    Breakage(
        "smoke-defaults-ignored",
        "recipe/profiles.py",
        "        defaults = {name.lower(): value for name, value in SMOKE_SETTINGS.items()}\n",
        "        defaults = {}  # broken: the profile's settings are not taken\n",
        (f"{RUN}::test_profile_smoke_takes_its_defaults",),
        "PROFILE=smoke no longer takes its defaults (recipe.profiles.profile_defaults)",
    ),
    Breakage(
        "smoke-overrides-dropped",
        "recipe/profiles.py",
        "        from recipe.smoke import smoke_overrides\n",
        "        smoke_overrides = list  # broken: the profile adds no override\n",
        (f"{RUN}::test_profile_smoke_adds_its_overrides_and_the_users_come_last",),
        "build_plan no longer appends the smoke overrides",
    ),
    Breakage(
        "run-report-dropped",
        "recipe/run/trainer.py",
        "    write_run_report(plan, code)\n",
        "    pass  # broken: no run report\n",
        ("tests/unit/test_run_report.py::test_a_run_with_no_metrics_still_reports_and_keeps_its_exit",),
        "run no longer writes run-report.json at the trainer's end",
    ),
    Breakage(
        "resume-guard-removed",
        "recipe/run/trainer.py",
        "        problem = resume_problem(plan)\n",
        "        problem = None\n",
        (f"{RUN_CHECKS}::test_run_refuses_to_resume_from_a_broken_export_and_its_advice_works",),
        "run resumes from a broken HF export (the guard is gone from run_command)",
    ),
    Breakage(
        "fresh-start-over-saves",
        "recipe/run_length.py",
        "        if saves:\n",
        "        if False:  # broken: verl trains afresh over the saves\n",
        (f"{UNIT}/test_tracker_states.py",),
        "a dangling tracker, or none, beside saved steps: plan says 'starts fresh' and run trains over them (issue 50)",
    ),
    Breakage(
        "own-folder-kind-unchecked",
        "recipe/own_paths.py",
        "        if kind not in (\"a directory\", \"a link to a directory\"):\n",
        "        if False:  # broken: a file where our folder goes passes the plan\n",
        (f"{UNIT}/test_own_paths.py",),
        "PROFILE=bench with CHECKPOINT_DIR/bench-data a file: plan passes, run dies with a traceback (issue 50)",
    ),
    Breakage(
        "lost-node-unnamed",
        "recipe/cluster/supervisors.py",
        "        lost = watch.settle(code)\n",
        "        lost = []  # broken: a node lost during the run goes unnamed\n",
        (f"{UNIT}/cluster/test_with_real_ray.py::test_a_worker_lost_while_the_trainer_waits_ends_the_head_in_bounded_time_naming_it",),
        "a worker lost while the trainer waits: the head's run ends 143 with no word of the node (issue 51)",
    ),
    Breakage(
        "report-devices-of-one-node",
        "recipe/run/trainer.py",
        "    inputs = ReportInputs(code, plan.layout.world_size,",
        "    inputs = ReportInputs(code, plan.layout.ndevices_per_node,  # broken: one node's devices for the world",
        (f"{UNIT}/test_run_report.py::test_the_report_of_a_run_on_several_nodes_counts_every_device_of_every_node",),
        "the run report's tokens/s/device and MFU of a run on several nodes divide by one node's devices (issue 52)",
    ),
    Breakage(
        "estimated-total-never-finished",
        "recipe/run_length.py",
        "        return self.step is not None and self.total is not None and self.step >= self.total.steps",
        "        return self.step is not None and self.total is not None and not self.total.estimated and self.step >= self.total.steps",
        (f"{UNIT}/test_run_finish.py::test_plan_and_the_finish_check_agree_for_every_resume_mode_and_total",),
        "plan never says a run with an estimated total finished, where run's finish check does (issue 52)",
    ),
    Breakage(
        "finish-check-on-a-chosen-step",
        "recipe/run/finish.py",
        '    if override_value(plan.overrides, "trainer.resume_mode") != "auto":',
        '    if override_value(plan.overrides, "trainer.resume_mode") == "disable":  # broken: resume_path too',
        (f"{UNIT}/test_run_finish.py::test_plan_and_the_finish_check_agree_for_every_resume_mode_and_total",),
        "a step the user chose (resume_path) at the total: run says 'already finished' and trains nothing (issue 52)",
    ),
    Breakage(
        "read-back-bound-off-by-one",
        "recipe/read_back.py",
        "        if total > limit:\n",
        "        if total >= limit:  # broken: a file of exactly its bound is refused\n",
        ("tests/unit/export/test_digests.py::test_read_file_takes_a_file_of_exactly_its_bound_and_refuses_one_byte_more",),
        "a record, report or tracker of exactly its size bound is refused as too large (issue 52)",
    ),
    Breakage(
        "manifest-without-sha-trusted",
        "recipe/run/prompt_budget.py",
        "    if not isinstance(recorded_sha, str):",
        "    if False:  # broken: a manifest that names no sha256",
        ("tests/unit/data/test_prompt_lengths.py::test_a_manifest_with_a_field_missing_is_a_reason_naming_it",),
        "a prepare-data manifest without its sha256 is reported as describing another file (issue 52)",
    ),
    Breakage(
        "images-in-every-prompt-claimed",
        "recipe/smoke/verdict.py",
        '    where = "every prompt" if with_images == len(data.image_tokens) else',
        '    where = "every prompt" if True else',
        ("tests/unit/smoke/test_verdict.py::test_data_where_only_some_prompts_carry_images_is_said_so",),
        "the smoke verdict says every prompt carried images where only some did (issue 52)",
    ),
    Breakage(
        "bench-data-anywhere-under-checkpoint-dir",
        "recipe/bench/profile.py",
        "    if not Path(train_file).is_relative_to(bench_data_dir(checkpoint_dir)):",
        "    if not Path(train_file).is_relative_to(checkpoint_dir):  # broken: a user's files count as bench data",
        ("tests/unit/test_bench_profile.py::test_only_the_profiles_own_folder_is_bench_data_not_a_users_files_under_checkpoint_dir",),
        "PROFILE=bench overwrites a user's training file kept under CHECKPOINT_DIR with synthetic rows (issue 52)",
    ),
    Breakage(
        "memory-peak-of-the-last-step",
        "recipe/run/report.py",
        "        measured = max(logged) if logged else None",
        "        measured = logged[-1] if logged else None  # broken: the last step's, not the peak",
        (f"{UNIT}/test_run_report.py::test_a_phase_timed_in_some_steps_its_share_and_the_peak_over_more_steps_than_one",),
        "the run report's memory row shows the last step's value, not the run's peak (issue 52)",
    ),
    Breakage(
        "rayjob-nnodes-disagrees",
        "k8s/overlays/gpu-ray/kustomization.yaml",
        "      - NNODES=2\n",
        "      - NNODES=3  # broken: one worker replica\n",
        ("tests/deploy/test_k8s.py::test_each_overlays_rendered_settings_are_valid_values_and_its_size_agrees",),
        "a RayJob overlay whose NNODES disagrees with its worker replicas renders and plans (issues 52, 54)",
    ),
    Breakage(
        "worker-calls-a-lost-head-the-end-of-the-run",
        "recipe/cluster/supervisors.py",
        "                if ended is None:\n",
        "                if False:  # broken: a lost head reads as a finished run\n",
        ("tests/unit/cluster/test_supervisors.py",),
        "a worker whose head was lost mid-run exits 0 and its restart policy leaves it stopped (issue 51)",
    ),
    Breakage(
        "earlier-run-report-counts-as-this-runs",
        "recipe/run/finish.py",
        "        if _mark_of(info) == mark:\n",
        "        if False:  # broken: the report seen at the join counts\n",
        ("tests/unit/test_run_finish.py::test_the_report_seen_at_the_join_is_an_earlier_runs",),
        "a finished run's old report makes a worker call a lost head the end of this run (issue 51)",
    ),
    Breakage(
        "worker-raylet-waits-a-minute-for-a-lost-head",
        "recipe/cluster/ray_node.py",
        "    node_env.setdefault(GCS_RECONNECT_VARIABLE, str(GCS_RECONNECT_TIMEOUT_S))\n",
        "    pass  # broken: Ray's 60 s wait for a GCS that never comes back\n",
        ("tests/unit/cluster/test_ray_node.py",),
        "a worker's raylet waits Ray's 60 s for a lost head's GCS, past the documented bound (issue 51)",
    ),
    Breakage(
        "task-runner-placed-anywhere",
        "recipe/trainer_main.py",
        "    main_ppo.TaskRunnerV1 = OnTheHead(main_ppo.TaskRunnerV1)\n",
        "    pass  # broken: Ray places verl's TaskRunner where it likes\n",
        ("tests/unit/test_trainer_main.py::test_main_starts_verl_with_the_task_runner_on_the_head",),
        "verl's driver actor lands on a worker, and a lost worker takes the run's driver with it (issue 51)",
    ),
    Breakage(
        "resumed-smoke-run-judged-from-step-1",
        "recipe/smoke/verdict.py",
        "    expected = range(first, steps + 1)\n",
        "    expected = range(1, steps + 1)  # broken: a resumed run misses the steps it never trained\n",
        ("tests/unit/smoke/test_verdict_rules.py",),
        "a restarted smoke run that resumed fails its verdict on the steps before its save (issue 51)",
    ),
    Breakage(
        "export-report-of-another-step-trusted",
        "recipe/export/evidence.py",
        "    if evidence.step != step or evidence.export != export.relative_to(step_dir).as_posix():\n",
        "    if False:  # broken: a report copied from another step counts\n",
        ("tests/unit/export/test_report_evidence.py",),
        "a watcher's report copied beside another step's export finishes the run unchecked (issue 50)",
    ),
    Breakage(
        "export-watcher-removed",
        "recipe/run/trainer.py",
        "    with _export_watcher(plan), _progress(plan, progress):\n",
        "    with _progress(plan, progress):\n",
        (f"{RUN_CHECKS}::test_run_checks_the_export_of_each_save_and_reports_a_broken_one",),
        "run no longer checks each save's HF export",
    ),
    Breakage(
        "trainer-env-ignores-plan",
        "recipe/run/trainer.py",
        "    for name, value in plan.env.items():\n",
        "    for name, value in {}.items():\n",
        (f"{RUN}::test_run_gives_the_trainer_the_plans_command_and_environment",),
        "the allocator variable reaches the trainer as the user set it",
    ),
    Breakage(
        "exit-3-becomes-1",
        "recipe/cli.py",
        "EXIT_CLUSTER = 3\n",
        "EXIT_CLUSTER = 1\n",
        (f"{RUN}::test_a_cluster_that_never_forms_exits_3_and_never_runs_the_trainer",),
        "a cluster that never forms exits like a trainer failure",
    ),
    Breakage(
        "npu-default-pp-1",
        "recipe/layout.py",
        '"npu": {"TP": 2, "PP": 2,',
        '"npu": {"TP": 2, "PP": 1,',
        (f"{UNIT}/test_layout.py::test_upstream_defaults_fill_unset_values",
         f"{UNIT}/test_cli.py::test_plan_on_npu_uses_upstreams_npu_layout"),
        "the npu default PP drifts from upstream's 2",
    ),
    Breakage(
        "json-safe-writer-not-installed",
        "recipe/worker_setup.py",
        "    verl_patch.install()\n",
        "    pass\n",
        (f"{UNIT}/test_worker_setup.py::test_in_a_ray_worker_the_json_safe_writer_is_installed",),
        "Ray workers keep verl's transformer_config.json writer, which raises on odd values",
    ),
    Breakage(
        "hub-token-printed",
        "recipe/data/source.py",
        '            text = text.replace(value, "**********")\n',
        "            pass\n",
        (f"{UNIT}/data/test_command.py::test_a_hub_error_never_prints_the_token_or_the_endpoint",),
        "prepare-data prints HF_TOKEN / HF_ENDPOINT from a hub error",
    ),
    Breakage(
        "resume-loses-optimizer-state",
        "recipe/launch.py",
        '    _add(o, f"{actor}.checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"])\n',
        '    _add(o, f"{actor}.checkpoint.save_contents", ["model", "extra", "hf_model"])\n',
        (f"{UNIT}/test_verl_compose.py::test_every_plan_saves_and_loads_what_a_lossless_resume_needs",),
        "verl saves (and so loads) no optimizer state: a resumed run restarts Adam and the LR schedule "
        "(tests/e2e/test_resume.py's lossless tests fail too, in the e2e phase)",
    ),
    Breakage(
        "smoke-images-check-blind",
        "recipe/smoke/verdict.py",
        "        elif low not in lengths or high not in lengths:\n",
        "        elif False:  # broken: any prompt length passes\n",
        (f"{UNIT}/smoke/test_verdict.py::test_a_run_whose_images_were_dropped_fails_the_image_check",),
        "a smoke run whose images never reached vLLM or the actor passes the verdict",
    ),
    Breakage(
        "smoke-data-text-only",
        "recipe/smoke/arithmetic.py",
        '        "images": [{"bytes": picture(problem), "path": None}],\n',
        '        "images": [],  # broken: no image in the smoke rows\n',
        (f"{UNIT}/smoke/test_arithmetic.py::test_the_files_hold_the_asked_rows_indexed_by_split",),
        "the smoke data lose their images: the smoke run (and the e2e) test the text path only",
    ),
    Breakage(
        "prompt-budget-warning-dropped",
        "recipe/run/trainer.py",
        "        _warn_about_prompt_budget(plan)\n",
        "        pass  # broken: no warning about rows verl will drop\n",
        (f"{RUN}::test_run_warns_before_the_trainer_when_the_prompt_budget_drops_rows",),
        "verl drops too-long prompts without a word and `run` no longer says so first",
    ),
    Breakage(
        "smoke-verdict-ignored",
        "recipe/run/trainer.py",
        "    return 0 if verdict.passed else EXIT_SMOKE_FAILED\n",
        "    return 0\n",
        (f"{UNIT}/smoke/test_smoke_run.py::test_profile_smoke_whose_export_was_never_trained_exits_4_naming_the_check",),
        "a smoke run whose verdict is FAIL exits 0: a user's CI passes a broken image",
    ),
    Breakage(
        "replay-writes-any-key",
        "recipe/replay.py",
        "if name in REPLAYABLE and value is not None]",
        "if value is not None]",
        (f"{UNIT}/export/test_replay_hostile.py::test_only_settings_are_written",),
        "replay writes any key of a record (PATH, LD_PRELOAD, HF_ENDPOINT, a redacted HF_TOKEN) as a live line",
    ),
    Breakage(
        "dangling-record-skips-the-drift-guard",
        "recipe/record_file.py",
        '        if os.path.lexists(path):\n            raise UnreadableRecord(f"{path}: a symlink to nothing") from None\n',
        "",
        (f"{UNIT}/export/test_record_hostile.py::test_an_unreadable_stored_record_refuses_the_resume_whatever_allow_drift_says",),
        "a run-record.json that is a dangling symlink counts as no record: the resume goes on with no drift check",
    ),
    # Issue 27: one breakage per group of behaviours that one-line bugs broke unnoticed.
    Breakage(
        "allow-drift-accepts-any-field",
        "recipe/provenance.py",
        "        if field in allowed:\n",
        "        if allowed:\n",
        (f"{UNIT}/export/test_provenance.py::test_allow_drift_accepts_exactly_the_fields_it_names",),
        "ALLOW_DRIFT=TRAIN_FILES also accepts a changed TP, model or framework: a resume mixes two runs",
    ),
    Breakage(
        "doctor-check-error-is-a-warning",
        "recipe/doctor/checks.py",
        'status, reason = "fail", f"{type(error).__name__}: {error}"',
        'status, reason = "warn", f"{type(error).__name__}: {error}"',
        (f"{UNIT}/test_doctor.py::test_a_local_check_that_raises_is_a_failure_and_exit_1",),
        "a doctor check that crashes counts as a warning: the init container passes a broken node (exit 0)",
    ),
    Breakage(
        "strict-attributed-to-offload",
        "recipe/launch.py",
        'settings.export_strict, setting="EXPORT_STRICT")',
        'settings.export_strict, setting="OFFLOAD")',
        (f"{UNIT}/test_settings_table.py::test_an_override_of_each_decided_key_is_refused_naming_its_setting",),
        "an override of checkpoint.strict is refused naming OFFLOAD: the user changes the wrong setting",
    ),
    Breakage(
        "join-waits-one-node-short",
        "recipe/cluster/supervisors.py",
        "    nodes = wait_for_nodes(role.address, role.nnodes, resource_name, devices_per_node, timeout_s,\n"
        "                           poll_interval_s=poll_interval_s, node_ip_address=node_ip_address)\n",
        "    nodes = wait_for_nodes(role.address, role.nnodes - 1, resource_name, devices_per_node, timeout_s,\n"
        "                           poll_interval_s=poll_interval_s, node_ip_address=node_ip_address)\n",
        (f"{UNIT}/cluster/test_supervisors.py::test_joining_an_existing_cluster_waits_for_every_node",),
        "on a RayJob the trainer starts before the last node joined: verl places its workers on too few devices",
    ),
    Breakage(
        "source-folder-by-string-prefix",
        "recipe/data/guard.py",
        "return real == root or real.startswith(root.rstrip(os.sep) + os.sep)",
        "return real == root or real.startswith(root)",
        (f"{UNIT}/data/test_hostile_sources.py::test_a_sibling_folder_that_shares_the_sources_name_is_outside_it",),
        "an image path into `src-evil/` passes as inside `src/`: prepare-data reads files outside --source",
    ),
    Breakage(
        "memory-fit-not-enforced",
        "recipe/plan.py",
        "        problems += memory.problems()\n",
        "        problems += []\n",
        (f"{UNIT}/test_memory_fit.py::test_without_offload_the_rollout_phase_does_not_fit_and_plan_says_so_in_one_line",),
        "a layout whose weights and vLLM's share exceed the device passes plan: the run dies of OOM at vLLM wake-up",
    ),
    Breakage(
        "finished-run-trained-again",
        "recipe/run/trainer.py",
        "    done = final_save(plan)\n    if done is not None:\n        # A restart",
        "    done = None\n    if done is not None:\n        # A restart",
        (f"{UNIT}/test_run_finish.py::test_a_second_run_after_a_finished_one_exits_0_and_starts_nothing",),
        "a restart of a finished run starts the trainer again (issue 39)",
    ),
    Breakage(
        "overrides-setting-ignored",
        "recipe/plan.py",
        "user_overrides(settings.override_list, extra_overrides)",
        "user_overrides([], extra_overrides)",
        (f"{UNIT}/test_plan_launch_paths.py::test_a_plan_with_overrides_equals_the_plan_with_them_after_the_separator",),
        "OVERRIDES no longer reaches the trainer's argv (issue 38)",
    ),
    Breakage(
        "special-file-read-back",
        "recipe/read_back.py",
        "        if not stat.S_ISREG(info.st_mode):\n            raise FileRefused(f\"{path}: not a regular file\")\n",
        "",
        (f"{UNIT}/test_read_back_hostile.py",),
        "a FIFO or folder is opened and read as if it were the file (issue 40, class 1)",
    ),
    Breakage(
        "number-digits-unbounded",
        "recipe/numbers.py",
        "or sum(c.isdigit() for c in text) > MAX_DIGITS",
        "",
        (f"{UNIT}/test_read_back_hostile.py::test_whole_number_refuses_long_text_before_int_sees_it",),
        "int() sees a number of any length (issue 40, class 2)",
    ),
    Breakage(
        "json-depth-escapes",
        "recipe/read_back.py",
        "    except (RecursionError, MemoryError):\n        raise FileRefused(f\"{where}: nested too deep to be read\") from None\n",
        "",
        (f"{UNIT}/test_read_back_hostile.py",),
        "JSON nested past the parser's depth escapes as RecursionError (issue 40, class 3)",
    ),
    Breakage(
        "degenerate-config-estimated",
        "recipe/model_sizes.py",
        "    low = 0 if key in ZERO_ALLOWED else 1\n",
        "    low = 0\n",
        (f"{UNIT}/test_model_sizes.py::test_a_zero_that_would_empty_a_term_of_the_estimate_is_refused_by_name",),
        "a head_dim of 0 makes a term of the estimate empty without a word (issue 40, class 4)",
    ),
    Breakage(
        "ctrl-c-is-a-traceback",
        "recipe/process_exit.py",
        "    except KeyboardInterrupt:\n        code = 128 + signal.SIGINT\n",
        "",
        (f"{UNIT}/test_process_exit.py::test_a_signal_ends_a_ray_process_with_the_shells_status_and_no_traceback",),
        "Ctrl-C ends a Ray process with a traceback and status 1 instead of 130 (issue 40, class 5)",
    ),
    Breakage(
        "rule-wording-whole-for-a-float",
        "recipe/settings_messages.py",
        "        rule = f\"must be a positive {'whole number' if whole else 'number'}\"\n",
        "        rule = \"must be a positive whole number\"\n",
        (f"{UNIT}/test_settings_messages.py::test_a_value_on_each_side_of_a_bound_and_the_rule_the_message_states",),
        "DEVICE_MEMORY_GIB's refusal says 'whole number' while it takes 0.5 (issue 40, class 6)",
    ),
    Breakage(
        "setting-message-unredacted",
        "recipe/settings_messages.py",
        "        raw = redact(raw)  # OVERRIDES with an unbalanced quote",
        "        raw = raw  # broken: no redaction  # OVERRIDES with an unbalanced quote",
        ("tests/unit/test_secret_in_messages.py::test_overrides_setting_never_repeats_a_secret",),
        "a setting's refusal repeats its whole value, a password in OVERRIDES included (issue 50)",
    ),
    Breakage(
        "ctrl-c-at-start-is-a-traceback",
        "recipe/process_exit.py",
        "        signal.signal(signal.SIGINT, _quiet_exit)\n",
        "        pass  # broken: Ctrl-C during the imports is Python's KeyboardInterrupt\n",
        ("tests/unit/test_signals_at_start.py",),
        "Ctrl-C while the recipe's modules load prints a KeyboardInterrupt traceback (issue 50)",
    ),
    Breakage(
        "env-file-bom-kept-for-compose",
        "recipe/env_file/judge.py",
        "    body = text[1:] if bom else text\n",
        "    body = text  # broken: Compose is judged to read the byte order mark as part of the first name\n",
        (f"{UNIT}/test_env_file_readers.py::test_each_encoding_is_judged_as_the_real_readers_read_it",),
        "a .env saved with a BOM: plan says Compose refuses the file, while Compose reads it and bash does not (issue 50)",
    ),
    Breakage(
        "sweep-fix-ignores-the-type",
        "recipe/user_overrides.py",
        "    if kind in (\"bool\", \"int\", \"float\"):\n",
        "    if kind in (\"bool\", \"int\"):  # broken: a float key's sweep is told to quote its value\n",
        (f"{UNIT}/test_override_slips.py::test_a_number_or_bool_sweep_is_told_to_give_one_value",),
        "a sweep on a float key suggests quoting, which verl's type check then refuses (issue 54, item 6)",
    ),
    Breakage(
        "health-sign-said-every-step",
        "recipe/run/health.py",
        "            if name not in self.active:\n",
        "            if True:  # broken: a sign still on is said again at every step\n",
        (f"{UNIT}/test_health.py::test_each_sign_is_said_once_when_it_starts_and_again_when_it_comes_back",),
        "a sign of a failing run repeats at every step instead of once when it starts (issue 53)",
    ),
    Breakage(
        "mismatch-gap-signed",
        "recipe/mismatch.py",
        "    gap = (rollout_log_prob - old_log_prob).abs() * response_mask  # a bool or 0/1 mask: torch promotes it\n",
        "    gap = (rollout_log_prob - old_log_prob) * response_mask  # broken: signed gaps cancel, as in verl's kl\n",
        (f"{UNIT}/test_mismatch.py::test_gaps_of_opposite_signs_do_not_cancel_and_padding_does_not_count",),
        "the mismatch in slime's unit becomes the signed mean, where opposite gaps cancel (issue 53)",
    ),
    Breakage(
        "kuberay-nodes-line-speaks-of-worker-runs",
        "recipe/plan.py",
        "failure_bounds(settings.nnodes, settings.ray_wait_timeout, settings.ray_address is not None)",
        "failure_bounds(settings.nnodes, settings.ray_wait_timeout, False)",  # broken: a RayJob's driver as a node
        (f"{UNIT}/test_plan_orchestration.py::test_under_kuberay_the_plan_states_no_worker_run_for_a_lost_head",),
        "plan's nodes line under RAY_ADDRESS promises a worker `run` that waits for a restarted head (issue 51)",
    ),
    Breakage(
        "url-password-needs-a-user-name",
        "recipe/redaction.py",
        'URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\\s:@]*:[^/\\s@]+@")\n',
        'URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\\s:@]+:[^/\\s@]+@")  # broken: a user name first\n',
        (f"{UNIT}/test_user_overrides_edges.py::test_a_url_with_a_password_and_no_user_name_is_refused_and_never_repeated",),
        "an override's URL with a password but no user name (redis://:pw@host) is accepted and recorded (issue 52)",
    ),
    Breakage(
        "cann-chip-ignored-in-an-image-without-labels",
        "recipe/chip.py",
        "    if setting is not None:\n",
        "    if setting is not None and labels is None:  # broken: an image without labels ignores CANN_CHIP\n",
        (f"{UNIT}/test_chip_sources.py::test_cann_chip_decides_where_no_label_names_a_chip",),
        "an npu image without labels plans for the default chip although CANN_CHIP names the other (issue 52)",
    ),
    Breakage(
        "smoke-reward-of-stripped-text",
        "recipe/smoke/reward.py",
        "    return sum(char.isdigit() for char in solution_str) / len(solution_str)\n",
        "    return sum(char.isdigit() for char in solution_str) / len(solution_str.strip())  # broken: blanks uncounted\n",
        (f"{UNIT}/smoke/test_reward.py::test_the_score_is_the_share_of_digits",),
        "the smoke reward divides by the stripped length: a whitespace-only response crashes verl's reward (issue 52)",
    ),
    Breakage(
        "images-judged-outside-the-run",
        "recipe/smoke/verdict.py",
        "    wrong: list[str] = []\n    for step in (step for step in range(first, steps + 1) if step in metrics):\n",
        "    wrong: list[str] = []\n    for step in sorted(metrics):  # broken: validation and earlier attempts' steps too\n",
        (f"{UNIT}/smoke/test_verdict_rules.py::test_steps_outside_the_run_are_not_judged_for_images",),
        "the smoke verdict's image check judges step 0 (validation) and steps before a resumed run's first (issue 52)",
    ),
    Breakage(
        "smoke-kl-judged-by-its-sign",
        "recipe/smoke/verdict.py",
        "            lambda v: abs(v) < MISMATCH_KL_LIMIT, lambda found: max(found, key=abs),\n",
        "            lambda v: v < MISMATCH_KL_LIMIT, lambda found: max(found, key=abs),  # broken: any negative KL passes\n",
        (f"{UNIT}/smoke/test_verdict_rules.py::test_a_bad_metric_fails_its_own_check_only_saying_what_it_measured",),
        "the smoke verdict passes a rollout/training KL of -0.02: verl's signed mean is judged by its sign (issue 53)",
    ),
    Breakage(
        "total-lowered-after-the-save-not-finished",
        "recipe/run_length.py",
        "        return self.step is not None and self.total is not None and self.step >= self.total.steps\n",
        "        return self.step is not None and self.total is not None and self.step == self.total.steps  # broken\n",
        (f"{UNIT}/test_tracker_states.py::test_a_resume_point_against_a_total_raised_lowered_or_estimated",),
        "a total lowered below the saved step: plan says the run resumes, where nothing is left to train (issue 52)",
    ),
    Breakage(
        "eta-averages-every-step",
        "recipe/run/progress.py",
        "            recent = [self.seconds[s] for s in sorted(self.seconds)[-5:]]\n",
        "            recent = [self.seconds[s] for s in sorted(self.seconds)]  # broken: the slow first steps stay in\n",
        (f"{UNIT}/test_progress.py::test_the_eta_averages_the_last_five_steps_only",),
        "the progress line's ETA averages every step, the slow first ones included, not the last five (issue 52)",
    ),
    Breakage(
        "phase-share-inverted",
        "recipe/run/report.py",
        '            share = f"{100 * median / step:5.1f} %" if step else ""\n',
        '            share = f"{100 * step / median:5.1f} %" if step else ""  # broken: the share inverted\n',
        (f"{UNIT}/test_run_report.py::test_the_table_of_three_steps_on_two_devices_line_by_line",),
        "the run report's share of each phase in the step is inverted (issue 52)",
    ),
    Breakage(
        "phase-timed-in-some-steps-unsaid",
        "recipe/run/report.py",
        '            often = "" if count == len(self.steps) else f"  ({count} of {len(self.steps)} steps)"\n',
        '            often = ""  # broken: a timer missing from some steps reads as every step\'s\n',
        (f"{UNIT}/test_run_report.py::test_the_table_of_three_steps_on_two_devices_line_by_line",),
        "the run report no longer says a phase was timed in only some steps (a timer missing from one step, issue 52)",
    ),
    Breakage(
        "health-curves-dropped",
        "recipe/health_log.py",
        "    return {**data, **sign_curves(watch.active)}\n",
        "    return data  # broken: the curves never reach verl's trackers\n",
        (f"{UNIT}/test_health_log.py::test_verls_tensorboard_gets_a_curve_a_sign_beside_its_own_metrics",),
        "the trainer's trackers (TensorBoard, W&B) get no health curves (issue 53)",
    ),
    Breakage(
        "health-curves-judge-unrounded",
        "recipe/health_log.py",
        '        return finite_or_none(struct.unpack("f", struct.pack("f", number))[0])\n',
        "        return number  # broken: judged from verl's float64, run from TensorBoard's float32\n",
        (f"{UNIT}/test_health_log.py::test_the_curves_are_on_exactly_where_run_judges_a_sign_on_from_the_same_event_files",),
        "a curve is off where `run` says its sign started: a metric at a bound rounds over it in TensorBoard (issue 53)",
    ),
    Breakage(
        "health-bounds-kept-from-workers",
        "recipe/launch.py",
        "        env[THRESHOLDS_VARIABLE] = settings.health_thresholds\n",
        "        pass  # broken: the workers judge the curves with the defaults\n",
        (f"{UNIT}/test_settings_table.py::test_changing_a_setting_changes_exactly_the_keys_its_row_names[HEALTH_THRESHOLDS-gpu]",),
        "HEALTH_THRESHOLDS changes `run`'s lines but not the trainer's curves (issue 53)",
    ),
    Breakage(
        "setting-rule-echoes-a-secret",
        "recipe/settings_messages.py",
        '    return f"{name}={raw!r}: {redact(rule)}"\n',
        '    return f"{name}={raw!r}: {rule}"  # broken: the rule quotes the value unredacted\n',
        (f"{UNIT}/test_health_thresholds.py::test_a_refused_value_never_repeats_a_secret_pasted_into_it",),
        "a token pasted into HEALTH_THRESHOLDS is repeated by the rule that quotes its unknown name (issue 53)",
    ),
    Breakage(
        "secret-after-an-empty-assignment-echoed",
        "recipe/user_overrides.py",
        "        after_withheld = shown_override(text) != repr(text) or ends_assigning_a_secret(text)\n",
        "        after_withheld = shown_override(text) != repr(text)  # broken: `hf_token=` then the secret\n",
        ("tests/unit/test_secret_in_messages.py::test_a_secret_split_off_an_empty_assignment_is_never_repeated"
         "[OVERRIDES-newline-+trainer.github_token]",),
        "a secret after `github_token=` and a line break in OVERRIDES is repeated in its refusal (found by hypothesis)",
    ),
    Breakage(
        "routing-replay-let-through",
        "recipe/routing_replay.py",
        "    if not on or ZERO_ROUTES_ISSUE in allowed_issues:\n",
        "    if True:  # broken: routing replay reaches verl unproven\n",
        ("tests/unit/test_routing_replay.py::test_any_value_but_off_is_refused",),
        "an override turning routing replay on trains with it unproven, no refusal (issue 53, item 3)",
    ),
)


def copy_repo(target: Path) -> Path:
    """This repository's files (no .venv, .git, caches) under `target`."""
    shutil.copytree(REPO, target, ignore=COPY_IGNORES, symlinks=True)
    return target


def pytest_in(copy: Path, tests: tuple[str, ...], log: Path, every_core: bool = False) -> int:
    """Run `tests` in the copy with its own recipe first on the path; returns pytest's exit code. EVERY_CORE: spread
    them over the cores (pytest-xdist), for a run that has the machine to itself."""
    env = {**os.environ, "PYTHONPATH": str(copy), "CI": "true"}
    env.pop("PYTEST_ADDOPTS", None)
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    if every_core:
        argv[3:3] = ["-n", "auto", "--dist", "worksteal"]
    with log.open("w") as out:
        return subprocess.run(argv, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


def apply(copy: Path, breakage: Breakage) -> str | None:
    """Apply the breakage in the copy; the reason it cannot be applied, or None."""
    path = copy / breakage.path
    text = path.read_text(encoding="utf-8")
    count = text.count(breakage.old)
    if count != 1:
        return f"{breakage.path}: the text to break occurs {count} times (expected once): update this breakage"
    path.write_text(text.replace(breakage.old, breakage.new), encoding="utf-8")
    return None


def try_breakage(work: Path, breakage: Breakage) -> tuple[bool, list[str]]:
    """Apply BREAKAGE to a copy of its own under WORK and run its tests: (caught, the lines to print)."""
    copy = copy_repo(work / breakage.name)
    try:
        problem = apply(copy, breakage)
        if problem:
            return False, [f"FAIL  {breakage.name}: {problem}"]
        started = time.monotonic()
        log = work / f"{breakage.name}.log"
        code = pytest_in(copy, breakage.tests, log)
        took = time.monotonic() - started
        if code in (1, 2):  # tests failed, or an error stopped them
            return True, [f"ok    {breakage.name}: caught ({took:.0f}s)"]
        why = f"FAIL  {breakage.name}: survived, pytest exit {code} ({took:.0f}s): {breakage.why}"
        return False, [why, log.read_text()[-2000:]]
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only these breakages (default: all)")
    parser.add_argument("--list", action="store_true", help="list the breakages and exit")
    args = parser.parse_args(argv)
    by_name = {b.name: b for b in BREAKAGES}
    if args.list:
        for b in BREAKAGES:
            print(f"{b.name:34} {b.path:24} {b.why}")
        return 0
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"unknown breakage(s): {', '.join(unknown)}")
    chosen = [by_name[n] for n in args.names] if args.names else list(BREAKAGES)

    work = Path(tempfile.mkdtemp(prefix="mutations-"))
    failures = 0
    try:
        control_tests = tuple(dict.fromkeys(t for b in chosen for t in b.tests))
        control = copy_repo(work / "control")
        started = time.monotonic()
        code = pytest_in(control, control_tests, work / "control.log", every_core=True)
        print(f"control (unbroken copy, {len(control_tests)} tests): exit {code} in {time.monotonic() - started:.0f}s",
              flush=True)
        if code != 0:
            print((work / "control.log").read_text()[-4000:])
            print("mutation check: the named tests do not pass on the unbroken copy", file=sys.stderr)
            return 1
        # Each breakage has its own copy and its own pytest process: they run side by side, one per core.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for caught, lines in pool.map(lambda breakage: try_breakage(work, breakage), chosen):
                print("\n".join(lines), flush=True)
                failures += 0 if caught else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"mutation check: {len(chosen) - failures} of {len(chosen)} breakages caught")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
