"""`entrypoint.py doctor [--json] [--only PATTERN] [--timeout SECONDS]`.

Exit codes: 0 every check ok (warnings allowed); 1 a check failed; 2 doctor cannot run
(bad settings, or `--only` selects no check). Each check is timed and bounded by a timeout;
probes run side by side, so the whole takes about as long as the slowest group of imports.

`--json` prints one document (SCHEMA_VERSION 1):

    schema_version 1, command "doctor", status "ok"|"warn"|"fail", exit_code 0|1, seconds
    environment  recipe_version; image {info_dir, labels (dict or null outside an image),
                 label_files, locks {file name: sha256}}; python {version, implementation,
                 executable, machine}; user {uid, gid, name, groups}; device {name, source,
                 reason, visible_devices}; driver {driver_version, cuda_driver_version, gpus,
                 kernel_module | driver_version, cann_version, cann_version_file,
                 npu_smi_version; problem}; versions {distribution: version or null};
                 checkpoint_dir
    notes        [str]
    checks       [{name, category (environment|imports|framework|device), status
                 (ok|warn|fail), reason (one line), seconds, timeout_s (null: in-process)}]
    summary      {ok, warn, fail: counts; failed: [names]; missing: [distributions]}

When doctor cannot run (exit 2): {schema_version, command, status "error", exit_code 2, errors}.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from recipe import __version__
from recipe.chip import assumed_chip, chip_problem
from recipe.device import detect_device
from recipe.doctor import checks, facts
from recipe.doctor.runner import CheckResult, run_probe
from recipe.errors import RecipeConfigError, report_errors
from recipe.export.report import printable
from recipe.help import add_command
from recipe.memory_fit import device_memory

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
#: Version of the `--json` document's shape; bumped when a field changes meaning or goes away.
SCHEMA_VERSION = 1
#: Check categories that test what the image provides (its packages and their builds), not the node.
IMAGE_CATEGORIES = ("imports", "framework")
#: The longest --timeout: a day; a check still running then is hung.
MAX_TIMEOUT_S = 86400


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if not 0 < value <= MAX_TIMEOUT_S:  # inf and nan too: `--json` would print them, which is not JSON
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 and at most {MAX_TIMEOUT_S} seconds (a day)")
    return value


def add_doctor_parser(commands: Any) -> None:
    """Register `doctor` on the CLI's subcommands."""
    doctor = add_command(
        commands, "doctor",
        summary="check this image and machine: environment report, then ok/warn/fail checks",
        description="Print an environment report (image labels, locks, Python, framework versions, driver, "
        "devices seen and why), then run timed checks, each ok, warn or fail with one line of reason: every "
        "distribution the trainer needs imports, Transformer Engine or torch_npu, Triton, the allocator switch, "
        "user and volumes, versions against labels, and with a device a matmul, a collective and memory.",
        exit_codes={0: "every check ok (warnings allowed)", 1: "a check failed", 2: "doctor cannot run (bad settings)"},
        examples=["entrypoint.py doctor", "entrypoint.py doctor --json --only 'import:*'"],
    )
    doctor.add_argument("--json", action="store_true", help="one JSON document on stdout")
    doctor.add_argument(
        "--only", action="append", metavar="PATTERN",
        help="run only the checks whose name matches this glob (repeatable), e.g. 'import:*' or labels",
    )
    doctor.add_argument(
        "--no-devices", action="store_true",
        help="a machine without accelerators by design (CI, a build host): no visible device is a warning; "
        "without it, a node whose devices are not visible fails",
    )
    doctor.add_argument(
        "--timeout", type=_positive_seconds, metavar="SECONDS",
        help="limit of every check (default: 180 for an import, 120 for a framework check, 60 on a device)",
    )


def _environment(settings: Any, detection: Any, info_dir: Any, labels: Any, driver: facts.DriverFacts) -> dict[str, Any]:
    device = detection.name
    return {
        "recipe_version": __version__,
        "image": {
            "info_dir": str(info_dir),
            "labels": labels[0] if labels else None,
            "label_files": labels[1] if labels else [],
            "locks": facts.lock_digests(info_dir),
        },
        "python": facts.python_facts(),
        "user": facts.user_facts(),
        "device": detection.to_dict(),
        "driver": {**driver.facts, "problem": driver.problem},
        "versions": {name: facts.distribution_version(name) for name in facts.REPORTED_DISTRIBUTIONS[device]},
        "checkpoint_dir": str(settings.checkpoint_dir),
    }


def _environment_text(env: dict[str, Any]) -> list[str]:
    image, device = env["image"], env["device"]
    labels = image["labels"]
    if labels is None:
        image_line = f"not in an image ({image['info_dir']}/labels.d missing)"
    else:
        image_line = (
            f"{labels.get('org.opencontainers.image.title', '?')} {labels.get('org.opencontainers.image.version', '?')}, "
            f"framework {labels.get('io.grpo-recipe.framework', '?')} (labels: {', '.join(image['label_files'])})"
        )
    locks = ", ".join(f"{name} sha256:{digest}" for name, digest in image["locks"].items()) or "none found"
    python, user = env["python"], env["user"]
    installed = [f"{name} {version}" for name, version in env["versions"].items() if version]
    absent = [name for name, version in env["versions"].items() if not version]
    driver = {k: v for k, v in env["driver"].items() if k not in ("gpus", "problem") and v}
    gpus = env["driver"].get("gpus") or []
    driver_line = ", ".join(f"{k} {v}" for k, v in driver.items()) or "not visible"
    if gpus:
        driver_line += f"; {len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_total']})"
    if env["driver"].get("problem"):
        driver_line += f"; {env['driver']['problem']}"
    return [
        f"image      {image_line}",
        f"locks      {locks}",
        f"python     {python['version']} {python['implementation']} {python['executable']} ({python['machine']})",
        f"user       uid {user['uid']} ({user['name'] or 'no passwd entry'}), gid {user['gid']}",
        f"device     {device['name']}: {device['reason']}; {device['visible_devices']} device node(s) visible",
        f"driver     {driver_line}",
        f"versions   {', '.join(installed) or 'none'}" + (f"; not installed: {', '.join(absent)}" if absent else ""),
    ]


def _result_line(result: CheckResult) -> str:
    return f"  {result.status:<4}  {result.seconds:7.2f}s  {result.name:<30} {result.reason}"


#: Where each category's checks come in the report.
CATEGORY_ORDER = ("environment", "imports", "framework", "device")


def _order_key(planned: list[str]) -> Callable[[CheckResult], tuple[int, str, int]]:
    """Categories in CATEGORY_ORDER; imports by name; the rest as planned (devices in their order)."""
    index = {name: position for position, name in enumerate(planned)}

    def key(result: CheckResult) -> tuple[int, str, int]:
        rank = CATEGORY_ORDER.index(result.category) if result.category in CATEGORY_ORDER else len(CATEGORY_ORDER)
        if result.category == "imports":
            return rank, result.name.lower(), 0
        return rank, "", index.get(result.name, index.get(result.name.split(":", 1)[0], len(index)))

    return key


def _cannot_run(problems: list[str], as_json: bool) -> int:
    return report_errors("doctor", problems, EXIT_CANNOT_RUN, as_json)


def run_doctor(args: argparse.Namespace) -> int:
    """Report, check, print; the exit code."""
    began = time.monotonic()
    from recipe.settings import load_settings  # lazy: the settings are read only when doctor runs, after its parser

    try:
        settings = load_settings()
    except RecipeConfigError as error:
        return _cannot_run(error.problems, args.json)
    environ = dict(os.environ)
    detection = detect_device(settings.device, environ=environ)
    device = detection.name
    info_dir = facts.image_info_dir(environ)
    labels = facts.read_labels(info_dir)
    if device == "npu" and detection.visible_devices:
        # An image built for the other chip cannot run here at all: said first, and alone (recipe.chip).
        mismatch = chip_problem()
        if mismatch:
            return _cannot_run([mismatch], args.json)

    driver_result: dict[str, facts.DriverFacts] = {}
    driver_lock = threading.Lock()

    def driver() -> facts.DriverFacts:
        with driver_lock:  # asked by the report and by the driver check: run the tools once
            if "facts" not in driver_result:
                driver_result["facts"] = facts.driver_facts(device, environ)
            return driver_result["facts"]

    plan = checks.build_plan(
        device, detection, devices_required=not getattr(args, "no_devices", False),
        checkpoint_dir=settings.checkpoint_dir,
        expandable_segments=settings.expandable_segments,
        labels=labels[0] if labels else None,
        info_dir=info_dir,
        driver=driver,
        environ=environ,
        timeout_s=args.timeout,
        assumed_memory=device_memory(settings.device_memory_gib, device, assumed_chip(labels[0] if labels else None, settings.cann_chip)[0]),
    )
    if args.only:
        def keep(name: str) -> bool:
            # `matmul:cuda:0` selects the matmul step (which checks every device).
            return any(
                fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(pattern, f"{name}:*") for pattern in args.only
            )

        planned = plan.names()
        plan.select(keep)
        if not plan.names():
            return _cannot_run(
                [f"--only {printable(' '.join(args.only))}: matches none of the checks ({', '.join(sorted(planned))})"], args.json
            )

    say: Callable[[str], None] = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    results: list[CheckResult] = list(plan.decided)
    with ThreadPoolExecutor(max_workers=max(1, len(plan.probes))) as pool:
        # The probes start first: they take the time; the report and the local checks are done meanwhile.
        futures = [pool.submit(run_probe, probe) for probe in plan.probes]
        environment = _environment(settings, detection, info_dir, labels, driver())
        say(f"doctor: grpo-recipe {__version__}, device {device}")
        for line in _environment_text(environment):
            say(f"  {line}")
        for note in plan.notes:
            say(f"  note       {note}")
        steps = sum(len(probe.steps) for probe in plan.probes)
        say(
            f"checks: {len(plan.local) + len(plan.decided)} here, {steps} in {len(plan.probes)} probe process(es) "
            "side by side, each bounded by its timeout"
        )
        results += [checks.run_local(name, category, check) for name, category, check in plan.local]
        for future in futures:
            results += future.result()

    image_only: list[str] = []
    if labels is None:
        # Not in an image: what only the image can provide (its packages, their builds) says
        # nothing about this node. Those failures are warnings here, so that the exit code is
        # about the node (driver, devices, volumes, user), and they are named as such.
        for index, result in enumerate(results):
            if result.status == "fail" and result.category in IMAGE_CATEGORIES:
                results[index] = dataclasses.replace(
                    result, status="warn", reason=f"{result.reason} [not in an image: the image provides this]"
                )
                image_only.append(result.name)
    results.sort(key=_order_key(plan.names()))
    for result in results:
        say(_result_line(result))
    counts = {status: sum(r.status == status for r in results) for status in ("ok", "warn", "fail")}
    failed = [r.name for r in results if r.status == "fail"]
    code = EXIT_FAILED if failed else EXIT_OK
    seconds = time.monotonic() - began
    if args.json:
        document = {
            "schema_version": SCHEMA_VERSION,
            "command": "doctor",
            "status": "fail" if failed else ("warn" if counts["warn"] else "ok"),
            "exit_code": code,
            "seconds": round(seconds, 3),
            "environment": environment,
            "notes": plan.notes,
            "checks": [r.to_dict() for r in results],
            "summary": {**counts, "failed": failed, "missing": plan.missing, "image_only": image_only},
        }
        print(json.dumps(document, indent=2))
    else:
        say(f"doctor: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail in {seconds:.1f} s; exit {code}")
        if failed:
            say(f"failed: {', '.join(failed)}")
        if image_only:
            say(f"not in an image, so not counted against this node: {', '.join(image_only)} (use the image)")
        if plan.missing:
            say(f"not installed: {', '.join(plan.missing)}")
    return code
