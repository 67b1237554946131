"""The resume guard: what verl would resume from, and whether its Hugging Face export can be trusted."""

from __future__ import annotations

import logging

from recipe.checkpoint_tracker import ResumeCheckError
from recipe.export.watch import REPORT_NAME
from recipe.launch import (
    checkpoint_root,
    resume_mode_problem,
)
from recipe.plan import Plan
from recipe.run_length import RESUME_WAYS_OUT, RESUMED_HF_DIR, resume_point

logger = logging.getLogger("recipe")


def _resume_mode(plan: Plan) -> tuple[str | None, str | None]:
    """(mode, None) for the trainer.resume_mode verl will read, or (None, problem) when it cannot be told."""
    # lazy: composing verl's config imports Hydra; only a resume that needs the guard
    from recipe.verl_config import compose_verl_config, verl_config_dir

    config_dir = verl_config_dir()
    if config_dir is None:
        return None, "trainer.resume_mode: cannot be read without verl's trainer config (verl is not installed)"
    try:
        # lazy: omegaconf is heavy or absent where this module is imported; loaded only here
        from omegaconf import OmegaConf

        trainer = compose_verl_config(plan.overrides, config_dir).get("trainer")
        mode = OmegaConf.to_container(trainer, resolve=False).get("resume_mode") if trainer is not None else None
    except Exception as error:  # the plan composed; anything else means the guard cannot read it
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        return None, f"trainer.resume_mode: cannot be read from verl's composed config ({first[:300]})"
    problem = resume_mode_problem(mode)
    return (None, problem) if problem else (mode, None)


def resume_problem(plan: Plan) -> str | None:
    """Refuse to resume from a checkpoint the guard cannot vouch for; None when resuming is safe (or not asked).

    With verl's defaults (no Megatron dist checkpoint) the HF export of a save is the
    only copy of the model weights, and `trainer.resume_mode=auto` reloads it: training
    on from an export that lost tensors would silently continue from a damaged model.
    Takes the step by the plan's rule (recipe.run_length.resume_point: an unreadable tracker, an
    unfinished save, a fresh start over saves are refused there) and refuses an HF export that cannot
    be checked or is broken, and a resume mode it cannot read. Writes nothing.
    `resume_mode=resume_path` (a step the user chose) and `disable` pass.
    """
    mode, problem = _resume_mode(plan)
    if problem:
        return f"{problem}; {RESUME_WAYS_OUT}"
    if mode != "auto":
        return None  # the user chose where to resume from (or not to), after `--`
    where = f"CHECKPOINT_DIR={str(plan.settings.checkpoint_dir)!r}"
    try:
        # The plan's own rule (recipe.run_length): the plan refused these already, this guard holds it for `run`.
        point = resume_point(mode, None, checkpoint_root(plan.settings), None)
    except ResumeCheckError as error:
        return f"{where}: {error}; {RESUME_WAYS_OUT}"
    if point.path is None or point.step is None:
        return None
    step_dir, step = point.path, point.step
    export = step_dir / RESUMED_HF_DIR
    try:
        # lazy: the export checker loads only when there is an export to check
        from recipe.export.hf_check import verify_export

        report = verify_export(export, reference=None)
    except Exception as error:  # ExportCheckError, or anything hostile files make the checker raise
        return (
            f"{where}: the HF export of the checkpoint resume would load (step {step}) cannot be checked "
            f"({str(error)[:300]}); {RESUME_WAYS_OUT}"
        )
    if report.status != "broken":
        return None
    lost = ", ".join((report.missing + report.critical + report.errors)[:5]) or "see its report"
    saved_report = export.parent / REPORT_NAME
    see = f"; see {saved_report}" if saved_report.is_file() else ""
    return (
        f"{where}: the checkpoint resume would load (step {step}) has a broken HF export ({lost}){see}. "
        f"Do not train on from it: {RESUME_WAYS_OUT}"
    )
