"""Environment -> one typed, validated settings object.

Settings are read once. Values that depend on the device (TP, PP, ... and the
number of devices per node) stay `None` here when the user did not set them, so
that the layout can fill in the device's defaults and say where each value came
from; a value the user sets is never replaced.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PositiveInt,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from recipe.chip import Chip
from recipe.cluster.rules import gcs_address_problem, host_problem, ray_start_args_problem
from recipe.errors import RecipeConfigError
from recipe.hydra_text import literal_problem
from recipe.profiles import profile_defaults
from recipe.run.health import Thresholds, parse_thresholds, thresholds_text
from recipe.settings_messages import REDACTED, describe_error

DeviceChoice = Literal["auto", "gpu", "npu"]
ProfileChoice = Literal["full", "smoke", "bench"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def path_component_problem(value: str) -> str | None:
    """Why `value` is not one plain path component (checkpoints go to CHECKPOINT_DIR/PROJECT_NAME/EXPERIMENT_NAME)."""
    if value in {".", ".."} or "/" in value or "\x00" in value or _CONTROL.search(value):
        return (
            "must be a single path component (no '/', not '.' or '..', no NUL or control characters), "
            "so that checkpoints stay inside CHECKPOINT_DIR"
        )
    return None


class Settings(BaseSettings):
    """Every setting of the recipe, read from environment variables of the same name (upper case)."""

    model_config = SettingsConfigDict(
        case_sensitive=False,
        # Compose passes unset variables as empty strings (`TP=${TP:-}`): empty means unset.
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
    )

    # --- target -------------------------------------------------------------
    device: DeviceChoice = Field("auto", description="Target: gpu, npu, or auto (detected without importing torch).")

    profile: ProfileChoice = Field(
        "full",
        description=(
            "full: train MODEL_PATH on TRAIN_FILES. smoke: 3 GRPO steps of a tiny random Qwen3.5-MoE on one "
            "device, built offline under CHECKPOINT_DIR/smoke-assets; run it first on a new machine (docs/smoke.md). "
            "bench: a few steps of MODEL_PATH on the real layout with synthetic prompts of fixed lengths, ending with "
            "the run report: tokens/s/device and memory against the estimate (docs/performance.md)."
        ),
    )

    # --- parallel layout (None: the device's default, see layout.DEVICE_DEFAULTS) ---
    tp: PositiveInt | None = Field(None, description="Megatron tensor parallel size of the actor and reference.")
    pp: PositiveInt | None = Field(None, description="Megatron pipeline parallel size.")
    cp: PositiveInt | None = Field(None, description="Megatron context parallel size.")
    ep: PositiveInt | None = Field(None, description="Megatron expert parallel size.")
    etp: PositiveInt | None = Field(None, description="Megatron expert tensor parallel size.")
    gen_tp: PositiveInt | None = Field(None, description="vLLM tensor parallel size of the rollout.")
    nnodes: PositiveInt = Field(1, description="Number of nodes in the run.")
    ndevices_per_node: PositiveInt | None = Field(
        None, description="Accelerators per node (gpu default 8; npu: 16 on a3, 8 cards of 2 dies; 8 on 910b)."
    )

    cann_chip: Chip | None = Field(
        None,
        description=(
            "npu: the Ascend chip to plan for, a3 (16 NPUs a node) or 910b (Atlas A2, 8), where no image label "
            "says it (plan on a laptop); also the npu image's build argument. Default: the image's, else a3."
        ),
    )

    device_memory_gib: float | None = Field(
        None,
        gt=0,
        le=4096,
        allow_inf_nan=False,
        description="Memory of one device in GiB for plan's memory-fit estimate (default: 80 on gpu, the chip's on npu).",
    )
    peak_tflops: float | None = Field(
        None,
        gt=0,
        le=100_000,
        allow_inf_nan=False,
        description="Dense bf16 peak of one device in TFLOP/s, for the run report's MFU (default: an H100's 989 on gpu; "
        "none on npu, where the report then gives the achieved TFLOP/s only).",
    )

    # --- several nodes ------------------------------------------------------
    node_rank: int = Field(0, ge=0, description="This node's rank; 0 starts the Ray head and the trainer.")
    master_addr: str | None = Field(
        None, description="IP address or RFC 1123 host name of the rank-0 node, no port (needed when NNODES > 1)."
    )
    ray_port: int = Field(6379, ge=1, le=65535, description="Port of the Ray head started on rank 0.")
    ray_address: str | None = Field(
        None, description="GCS host:port of a running Ray cluster to join (set by KubeRay); no head is started then."
    )
    ray_start_args: str | None = Field(None, description="Extra `ray start` flags for this node, as shell words (e.g. "
                                       "`--node-ip-address=10.0.0.5`); the recipe's own (--head, --address, ...) refused.")
    ray_wait_timeout: PositiveInt = Field(
        600, description="Seconds rank 0 waits for every node's devices to join Ray before it gives up."
    )
    ray_auth_mode: Literal["token", "disabled"] | None = Field(
        None,
        description=(
            "Ray's authentication, read by Ray itself: `token` (the same RAY_AUTH_TOKEN on every node) is required "
            "when NNODES > 1 starts Ray on the host network; `disabled` only on an isolated network."
        ),
    )

    # --- paths --------------------------------------------------------------
    model_path: Path = Field(Path("/models/Qwen3.5-35B-A3B"), description="Hugging Face model directory.")
    data_dir: Path = Field(Path("/data"), description="Where prepare-data writes; default root of the data files.")
    train_files: Path | None = Field(None, description="Training parquet (default DATA_DIR/geo3k/train.parquet).")
    val_files: Path | None = Field(None, description="Validation parquet (default DATA_DIR/geo3k/test.parquet).")
    checkpoint_dir: Path = Field(
        Path("/checkpoints"), description="Checkpoints, HF exports and TensorBoard logs live under this directory."
    )

    # --- run ----------------------------------------------------------------
    project_name: str = Field(
        "grpo_qwen3_5_35b_geo3k", min_length=1, description="Tracking project name; one path component."
    )
    experiment_name: str = Field(
        "qwen3_5_35b_megatron", min_length=1, description="Tracking experiment name; one path component."
    )
    save_freq: int = Field(20, description="Save a checkpoint (and HF export) every N steps; -1 disables.")
    test_freq: int = Field(5, description="Validate every N steps; -1 disables.")
    train_batch_size: PositiveInt = Field(32, description="Prompts per training step (also the PPO mini-batch).")
    rollout_n: PositiveInt = Field(5, description="Responses sampled per prompt (the GRPO group size).")
    total_epochs: PositiveInt = Field(15, description="Epochs over the training data.")
    offload: bool = Field(
        True, description="Offload actor/ref parameters (releasing gradient buffers) and optimizer state between phases."
    )
    export_strict: bool = Field(
        False, description="Megatron-Bridge strict key matching at HF export; False writes what matches and reports."
    )
    rollout_correction: Literal["token", "sequence", "off"] = Field("token", description=(
        "verl's truncated importance sampling of the rollout's samples, per token or per sequence (ratio cap 2), or "
        "off: vLLM and Megatron compute the MoE apart, so the update is off-policy (docs/health.md)."))
    health_thresholds: str | None = Field(None, description=(
        "Where the signs of a failing run start, as name=value pairs separated by commas over the defaults (e.g. "
        "mismatch_kl=0.005,flat_steps=20); every bound, its default and its source in docs/health.md."))
    seed: int = Field(
        42, ge=0, le=2**31 - 1, description="Seed of the data order, Megatron's initialisation and the rollout's sampling."
    )
    overrides: str | None = Field(
        None,
        description=(
            "Hydra overrides for verl, written as after `--` (separated by spaces, quoted as in a shell); the one "
            "way that works on every path (Compose, the Job, the RayJob). One after `--` for the same key wins."
        ),
    )
    allow_drift: str | None = Field(
        None,
        description=(
            "Comma-separated fields whose change since the checkpoint's run started a resume accepts "
            "(TRAIN_FILES, MODEL_PATH, FRAMEWORKS, RECIPE, IMAGE, a setting, or a Hydra key); see docs/reproducibility.md."
        ),
    )
    allow_upstream_issue: str | None = Field(
        None,
        description=(
            "Comma-separated upstream issues (e.g. vllm-ascend#10014) whose known failure a layout rule (or routing "
            "replay's refusal, vllm#44214) should let you try anyway, say with a release that fixes it; see docs/layout.md."
        ),
    )
    progress: Literal["on", "off", "auto"] = Field("on", description=(
        "`run`'s `progress:` line per step: on (plain lines, in `docker compose up`'s or a pod's log too), off, or "
        "auto (only on a terminal); `run --progress` / `--no-progress` win."))
    expandable_segments: bool = Field(
        True,
        description=(
            "Let verl turn the allocator's expandable segments on for training phases at run time. "
            "Never put in the environment, where vLLM's sleep-mode pool asserts on it."
        ),
    )

    # --- secrets (never printed) --------------------------------------------
    hf_token: SecretStr | None = Field(None, description="Hugging Face token for gated downloads.")
    wandb_api_key: SecretStr | None = Field(None, description="Weights & Biases key; wandb logging only when set.")
    ray_auth_token: SecretStr | None = Field(
        None, description="Ray's shared secret with RAY_AUTH_MODE=token, the same on every node (e.g. `openssl rand -hex 32`)."
    )

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        """PROFILE=smoke or bench: the profile's value for every setting the environment left unset."""
        if not isinstance(data, dict):
            return data
        return profile_defaults(data, cls.model_fields["checkpoint_dir"].default)

    @field_validator("project_name", "experiment_name")
    @classmethod
    def _one_path_component(cls, value: str) -> str:
        problem = path_component_problem(value) or literal_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("model_path", "data_dir", "train_files", "val_files", "checkpoint_dir")
    @classmethod
    def _literal_path(cls, value: Path | None) -> Path | None:
        problem = None if value is None else literal_problem(str(value))
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("master_addr", "ray_address", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("master_addr")
    @classmethod
    def _a_host(cls, value: str | None) -> str | None:
        problem = None if value is None else host_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("ray_address", "ray_start_args")
    @classmethod
    def _ray_values(cls, value: str | None, info: ValidationInfo) -> str | None:
        rule = gcs_address_problem if info.field_name == "ray_address" else ray_start_args_problem
        problem = None if value is None else rule(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("overrides")
    @classmethod
    def _shell_words(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                shlex.split(value)
            except ValueError as error:
                raise ValueError(f"must be overrides separated by spaces, quoted as in a shell ({error})") from None
        return value

    @property
    def override_list(self) -> list[str]:
        """OVERRIDES split into one override each, as a POSIX shell splits the words after `--`."""
        return shlex.split(self.overrides) if self.overrides else []

    @field_validator("allow_drift")
    @classmethod
    def _drift_fields(cls, value: str | None) -> str | None:
        if value is None:
            return None
        fields = [field.strip() for field in value.split(",")]
        bad = [field for field in fields if not re.fullmatch(r"[A-Za-z0-9_.]+", field)]
        if bad:
            raise ValueError(f"must be field names separated by commas (TRAIN_FILES,MODEL_PATH,...); not {bad[0]!r}")
        return ",".join(fields)

    @field_validator("allow_upstream_issue")
    @classmethod
    def _issue_refs(cls, value: str | None) -> str | None:
        if value is None:
            return None
        refs = [ref.strip() for ref in value.split(",")]
        bad = [ref for ref in refs if not re.fullmatch(r"[A-Za-z0-9_.-]+#[0-9]+", ref)]
        if bad:
            raise ValueError(f"must be upstream issues like vllm-ascend#10014, separated by commas; not {bad[0]!r}")
        return ",".join(refs)

    @property
    def allowed_upstream_issues(self) -> list[str]:
        """The upstream issues ALLOW_UPSTREAM_ISSUE names."""
        return self.allow_upstream_issue.split(",") if self.allow_upstream_issue else []

    @property
    def allowed_drift(self) -> list[str]:
        """The fields ALLOW_DRIFT names."""
        return self.allow_drift.split(",") if self.allow_drift else []

    @field_validator("health_thresholds")
    @classmethod
    def _health_bounds(cls, value: str | None) -> str | None:
        return None if value is None else thresholds_text(parse_thresholds(value))

    @property
    def thresholds(self) -> Thresholds:
        """Where run health's signs start: HEALTH_THRESHOLDS over the defaults."""
        return parse_thresholds(self.health_thresholds) if self.health_thresholds else Thresholds()

    @field_validator("save_freq", "test_freq")
    @classmethod
    def _positive_or_disabled(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive number of steps, or -1 to disable")
        return value

    @property
    def resolved_train_files(self) -> Path:
        """Training parquet: TRAIN_FILES, or where `prepare-data geo3k` writes."""
        return self.train_files or self.data_dir / "geo3k" / "train.parquet"

    @property
    def resolved_val_files(self) -> Path:
        """Validation parquet: VAL_FILES, or where `prepare-data geo3k` writes."""
        return self.val_files or self.data_dir / "geo3k" / "test.parquet"

    def user_set(self) -> set[str]:
        """Names of the settings the environment set (upper case, as the user wrote them)."""
        return {name.upper() for name in self.model_fields_set}

    def redacted(self) -> dict[str, Any]:
        """All settings as JSON-ready values, secrets replaced by REDACTED (or None when unset)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = REDACTED
            elif isinstance(value, Path):
                value = str(value)
            out[name.upper()] = value
        out["TRAIN_FILES"] = str(self.resolved_train_files)
        out["VAL_FILES"] = str(self.resolved_val_files)
        return out


def load_settings() -> Settings:
    """Read the settings from the process environment, once.

    Raises RecipeConfigError listing every bad variable at once.
    """
    try:
        return Settings()
    except ValidationError as exc:
        raise RecipeConfigError([describe_error(e, os.environ, Settings.model_fields) for e in exc.errors()]) from None
