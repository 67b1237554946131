"""`run` refuses to resume from a checkpoint whose HF export (the weights verl reloads) is broken.

The first tests use real exports and verl's real composition. The rest pin each exact refusal
line (and each pass) of the guard: the resume mode it reads, the tracker, the step's manifest, the
HF export missing, uncheckable, broken (its first five lost tensors, its saved report) or sound,
with verl's composition and the export checker stood in where they would cost seconds per case.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recipe.run.resume_guard import resume_problem
from recipe.plan import build_plan
from recipe.settings import Settings


def _checkpoint(root: Path, export: Path, step: int) -> None:
    """Lay out `export` as verl 0.9.1 saves step `step` under root (tracker file last)."""
    actor = root / f"global_step_{step}" / "actor"
    shutil.copytree(export, actor / "model" / "huggingface")
    (actor / "ckpt_contents.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))


def _plan(checkpoints: Path, *extra: str):  # type: ignore[no-untyped-def]
    settings = Settings.model_validate({"device": "gpu", "checkpoint_dir": checkpoints, "project_name": "p", "experiment_name": "e"})
    return build_plan(settings, {}, extra)


def test_a_complete_export_resumes(qwen35_copy: Path, tmp_path: Path) -> None:
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 20)
    assert resume_problem(_plan(tmp_path)) is None


def test_no_checkpoint_yet_is_fine(tmp_path: Path) -> None:
    assert resume_problem(_plan(tmp_path)) is None


def test_a_broken_export_blocks_resume_and_names_the_step(
    qwen35_copy: Path, tmp_path: Path, rewrite_checkpoint, tensors_of  # type: ignore[no-untyped-def]
) -> None:
    layer = next(name for name in tensors_of(qwen35_copy) if ".layers.1." in name)
    prefix = layer.split(".layers.1.")[0] + ".layers.1."
    rewrite_checkpoint(qwen35_copy, lambda tensors: [tensors.pop(k) for k in list(tensors) if k.startswith(prefix)])
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    problem = resume_problem(_plan(tmp_path))
    assert problem is not None
    assert problem.startswith(f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) has a broken HF export")
    assert prefix in problem and "trainer.resume_from_path" in problem


def test_an_explicit_resume_choice_is_not_blocked(
    qwen35_copy: Path, tmp_path: Path, rewrite_checkpoint, tensors_of  # type: ignore[no-untyped-def]
) -> None:
    """What the refusal tells the user to do must then work."""
    norm = next(name for name in tensors_of(qwen35_copy) if name.endswith("norm.weight"))
    rewrite_checkpoint(qwen35_copy, lambda tensors: tensors.pop(norm))
    _checkpoint(tmp_path / "p" / "e", qwen35_copy, 40)
    assert resume_problem(_plan(tmp_path)) is not None
    chosen = _plan(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}/p/e/global_step_20")
    assert resume_problem(chosen) is None


# --- the guard's exact lines, by direct calls ---------------------------------------------------
# Composing verl's config takes seconds; what the guard does with the composed trainer.resume_mode is
# tested here against a stand-in of that composition (the hostile tests compose verl's own).

#: The way out every refusal ends with (docs/export.md, "In one paragraph"): pinned, since users grep for it.
WAY_OUT = (
    "train under another EXPERIMENT_NAME, resume from a step you checked with "
    "`trainer.resume_mode=resume_path trainer.resume_from_path=<its global_step_N dir>`, or start afresh over the "
    "saves with `trainer.resume_mode=disable` (overrides: in OVERRIDES, or after `--` of plan and run)"
)
#: Why a resume mode is refused (recipe.launch.resume_mode_problem), after `trainer.resume_mode=<value>: `.
NOT_A_MODE = (
    "must be one of auto, disable, resume_path, written literally (verl 0.9.1 knows no other mode, and the resume "
    "guard checks what it reads before the run: an interpolation is resolved only later); use trainer.resume_mode=auto, "
    "trainer.resume_mode=disable, or trainer.resume_mode=resume_path trainer.resume_from_path=<global_step_N dir>"
)


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra's composition, for the one key the guard reads: verl 0.9.1's default `resume_mode: auto`
    (ppo_trainer.yaml), then each `trainer.resume_mode=...` override in order, unresolved."""
    from omegaconf import OmegaConf

    from recipe import verl_config

    def compose(overrides: list[str], config_dir: Path) -> object:
        config = OmegaConf.create({"trainer": {"resume_mode": "auto"}})
        config.merge_with_dotlist([o for o in overrides if o.startswith("trainer.resume_mode=")])
        return config

    monkeypatch.setattr(verl_config, "compose_verl_config", compose)


def _with_overrides(plan, *overrides: str):  # type: ignore[no-untyped-def]
    """The plan with these overrides appended, unchecked by build_plan (which refuses a bad mode itself)."""
    import dataclasses

    return dataclasses.replace(plan, overrides=[*plan.overrides, *overrides])


def _step(root: Path, step: int, *, manifest: bool = True, export: bool = True) -> Path:
    """global_step_N as verl 0.9.1 leaves it (an empty HF export folder unless told), and the tracker naming it."""
    step_dir = root / f"global_step_{step}"
    (step_dir / "actor").mkdir(parents=True)
    if export:
        (step_dir / "actor" / "model" / "huggingface").mkdir(parents=True)
    if manifest:
        (step_dir / "actor" / "ckpt_contents.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return step_dir


def test_without_verls_config_the_guard_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe import verl_config

    monkeypatch.setattr(verl_config, "verl_config_dir", lambda: None)
    assert resume_problem(_plan(tmp_path)) == (
        f"trainer.resume_mode: cannot be read without verl's trainer config (verl is not installed); {WAY_OUT}"
    )


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (ValueError("\n  \nCould not override 'trainer.x'.\nKey 'x' is not in struct"), "Could not override 'trainer.x'."),
        (ValueError("  \n "), "ValueError"),  # blank lines only
        (RuntimeError(""), "RuntimeError"),  # nothing to show but its kind
        (ValueError("e" * 400), "e" * 300),  # one line, cut
    ],
)  # fmt: skip
def test_a_composition_that_fails_is_refused_with_its_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, shown: str
) -> None:
    from recipe import verl_config

    def fail(overrides: list[str], config_dir: Path) -> object:
        raise error

    monkeypatch.setattr(verl_config, "compose_verl_config", fail)
    assert resume_problem(_plan(tmp_path)) == f"trainer.resume_mode: cannot be read from verl's composed config ({shown}); {WAY_OUT}"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ((), None),  # the recipe's own auto, nothing saved yet
        (("trainer.resume_mode=disable",), None),
        (("trainer.resume_mode=resume_path",), None),
        (("trainer.resume_mode=AUTO",), f"trainer.resume_mode='AUTO': {NOT_A_MODE}; {WAY_OUT}"),
        (("trainer.resume_mode=${oc.env:RECIPE_TEST_RESUME,auto}",),
         f"trainer.resume_mode='${{oc.env:RECIPE_TEST_RESUME,auto}}': {NOT_A_MODE}; {WAY_OUT}"),  # shown unresolved
    ],
)  # fmt: skip
def test_the_composed_resume_mode_decides_whether_the_guard_looks(
    tmp_path: Path, composed: None, overrides: tuple[str, ...], problem: str | None
) -> None:
    assert resume_problem(_with_overrides(_plan(tmp_path), *overrides)) == problem


@pytest.mark.parametrize("composition", [{"data": {}}, {"trainer": {"total_epochs": 1}}])
def test_a_composed_config_without_a_resume_mode_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, composition: dict[str, object]
) -> None:
    """No trainer section, or `~trainer.resume_mode` deleted the key: read as no mode, in Hydra's struct mode."""
    from omegaconf import OmegaConf

    from recipe import verl_config

    config = OmegaConf.create(composition)
    OmegaConf.set_struct(config, True)  # as Hydra composes it: reading a missing key raises
    monkeypatch.setattr(verl_config, "compose_verl_config", lambda overrides, config_dir: config)
    assert resume_problem(_plan(tmp_path)) == f"trainer.resume_mode=None: {NOT_A_MODE}; {WAY_OUT}"


def test_another_mode_never_looks_at_the_checkpoint(tmp_path: Path, composed: None) -> None:
    """disable and resume_path pass even where auto would find an incomplete step."""
    plan = _plan(tmp_path)  # before the step: the plan refuses an incomplete step itself
    _step(tmp_path / "p" / "e", 40, manifest=False)
    assert resume_problem(plan) is not None
    for mode in ("disable", "resume_path"):
        assert resume_problem(_with_overrides(plan, f"trainer.resume_mode={mode}")) is None


def test_auto_with_a_tracker_it_cannot_read_is_refused_naming_it(tmp_path: Path, composed: None) -> None:
    root, plan = tmp_path / "p" / "e", _plan(tmp_path)
    _step(root, 40)
    (root / "latest_checkpointed_iteration.txt").write_text("forty")
    assert resume_problem(plan) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: cannot tell which checkpoint verl would resume from: "
        f"{root / 'latest_checkpointed_iteration.txt'} holds 'forty', no step number: verl reads it with int(f.read().decode()) "
        f"and would fail on it; {WAY_OUT}"
    )


def test_auto_with_a_tracker_naming_no_saved_step_trains_afresh_only_over_nothing(tmp_path: Path, composed: None) -> None:
    root, plan = tmp_path / "p" / "e", _plan(tmp_path)
    root.mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("40")
    assert resume_problem(plan) is None  # nothing saved: nothing to lose
    _step(root, 20)
    (root / "latest_checkpointed_iteration.txt").write_text("40")  # past the newest save
    assert resume_problem(plan) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: {root / 'latest_checkpointed_iteration.txt'} names a step that is not "
        f"saved, so verl would train afresh over the saves beside it (global_step_20), overwriting or mixing them; "
        f"{WAY_OUT}"
    )


def test_auto_refuses_a_step_without_its_manifest(tmp_path: Path, composed: None) -> None:
    plan = _plan(tmp_path)
    step_dir = _step(tmp_path / "p" / "e", 40, manifest=False)
    assert resume_problem(plan) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) is incomplete: "
        f"{step_dir / 'actor' / 'ckpt_contents.json'}, which verl writes last, is missing; {WAY_OUT}"
    )


@pytest.mark.parametrize("export", ["missing", "a file"])
def test_auto_refuses_a_step_without_an_hf_export(tmp_path: Path, composed: None, export: str) -> None:
    plan = _plan(tmp_path)
    step_dir = _step(tmp_path / "p" / "e", 40, export=False)
    hf = step_dir / "actor" / "model" / "huggingface"
    if export == "a file":
        hf.parent.mkdir()
        hf.write_text("not a folder")
    assert resume_problem(plan) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) has no HF export at {hf} "
        f"(the weights verl reloads), so it cannot be checked; {WAY_OUT}"
    )


def test_auto_refuses_an_export_that_cannot_be_checked(tmp_path: Path, composed: None) -> None:
    hf = _step(tmp_path / "p" / "e", 40) / "actor" / "model" / "huggingface"  # empty: no config.json
    assert resume_problem(_plan(tmp_path)) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the HF export of the checkpoint resume would load (step 40) cannot be "
        f"checked ({hf}: no config.json (the export must carry the HF config)); {WAY_OUT}"
    )


def _report(status: str, missing: int = 0, critical: int = 0, errors: int = 0):  # type: ignore[no-untyped-def]
    from recipe.export.report import ExportReport

    return ExportReport(
        directory="x", status=status, architecture="Qwen3_5MoeForConditionalGeneration", expected_count=10,  # type: ignore[arg-type]
        present_count=10 - missing, missing=[f"m{i}" for i in range(missing)],
        critical=[f"c{i}" for i in range(critical)], errors=[f"e{i}" for i in range(errors)],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("report", "lost"),
    [
        (_report("broken", missing=1), "m0"),
        (_report("broken", missing=4, critical=2, errors=1), "m0, m1, m2, m3, c0"),  # the first five, missing first
        (_report("broken", critical=1, errors=6), "c0, e0, e1, e2, e3"),
        (_report("broken"), "see its report"),  # broken for a reason none of the lists names
    ],
)  # fmt: skip
def test_auto_refuses_a_broken_export_naming_the_first_five_lost_tensors(
    tmp_path: Path, composed: None, monkeypatch: pytest.MonkeyPatch, report: object, lost: str
) -> None:
    from recipe.export import hf_check

    seen: list[tuple[Path, object]] = []

    def verify(directory: Path, reference: Path | None = None) -> object:  # verify_export's own default
        seen.append((directory, reference))
        return report

    monkeypatch.setattr(hf_check, "verify_export", verify)
    hf = _step(tmp_path / "p" / "e", 40) / "actor" / "model" / "huggingface"
    assert resume_problem(_plan(tmp_path)) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) has a broken HF export ({lost}). "
        f"Do not train on from it: {WAY_OUT}"
    )
    assert seen == [(hf, None)]  # the export verl reloads, checked against no reference


def test_a_broken_export_names_the_report_the_watcher_wrote_beside_it(
    tmp_path: Path, composed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recipe.export import hf_check

    monkeypatch.setattr(hf_check, "verify_export", lambda directory, reference=None: _report("broken", missing=1))
    model = _step(tmp_path / "p" / "e", 40) / "actor" / "model"
    (model / "hf_export_report.json").write_text("{}")
    assert resume_problem(_plan(tmp_path)) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the checkpoint resume would load (step 40) has a broken HF export (m0); "
        f"see {model / 'hf_export_report.json'}. Do not train on from it: {WAY_OUT}"
    )


@pytest.mark.parametrize("status", ["complete", "lenient"])
def test_auto_resumes_from_a_complete_or_lenient_export(
    tmp_path: Path, composed: None, monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    from recipe.export import hf_check

    monkeypatch.setattr(hf_check, "verify_export", lambda directory, reference=None: _report(status, missing=1))
    _step(tmp_path / "p" / "e", 40)
    assert resume_problem(_plan(tmp_path)) is None


def test_a_checker_that_raises_anything_refuses_with_its_message_cut(
    tmp_path: Path, composed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile files can make the checker raise anything; the line stays short."""
    from recipe.export import hf_check

    def explode(directory: Path, reference: object = None) -> object:
        raise RuntimeError("x" * 400)

    monkeypatch.setattr(hf_check, "verify_export", explode)
    _step(tmp_path / "p" / "e", 40)
    assert resume_problem(_plan(tmp_path)) == (
        f"CHECKPOINT_DIR={str(tmp_path)!r}: the HF export of the checkpoint resume would load (step 40) cannot be "
        f"checked ({'x' * 300}); {WAY_OUT}"
    )
