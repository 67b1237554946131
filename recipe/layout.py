"""The parallel layout (TP, PP, CP, EP, ETP, GEN_TP, DP), checked before anything starts.

Every rule Megatron, vLLM or verl would enforce an hour into a run is checked
here against the model's architecture and the number of devices, and every
violation is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from recipe.chip import CHIPS, DEFAULT_CHIP, Chip
from recipe.cluster.rules import cluster_problems, ray_auth_problems
from recipe.device import DEFAULT_GPUS_PER_NODE, Device
from recipe.errors import RecipeConfigError
from recipe.models import ModelArchitecture
from recipe.settings import Settings

#: Upstream's tuned defaults (verl examples/grpo_trainer/run_qwen3_5_35b_megatron.sh).
DEVICE_DEFAULTS: dict[Device, dict[str, int]] = {
    "gpu": {"TP": 2, "PP": 1, "CP": 1, "EP": 8, "ETP": 1, "GEN_TP": 8},
    # GEN_TP=8 on npu: with TP4, vllm-ascend fails to load Qwen3.5-35B-A3B (an NZ-format matmul on a
    # [2048, 1] weight: vllm-ascend#10014, #11621), and verl's own A3 settings for this model went
    # from GEN_TP 4 to 8 after it (verl#6972). known_failure_problems refuses GEN_TP=4 there.
    "npu": {"TP": 2, "PP": 2, "CP": 1, "EP": 8, "ETP": 1, "GEN_TP": 8},
}

#: Upstream's npu defaults are tuned for an a3 node's 16 NPUs; on a 910b node's 8, EP x PP = 16
#: would not divide the world, so PP=1 there: the gpu layout for 8 devices (not tuned upstream).
CHIP_DEFAULTS: dict[Chip, dict[str, int]] = {"a3": {}, "910b": {"PP": 1}}

#: Upstream batches by token count (use_dynamic_bsz) on npu only; gpu uses fixed micro-batches.
DYNAMIC_BATCHING: dict[Device, bool] = {"gpu": False, "npu": True}


@dataclass(frozen=True)
class ParallelLayout:
    """A resolved, checked layout; `sources` says where each size came from."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    gen_tp: int
    nnodes: int
    ndevices_per_node: int
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """Devices in the whole run."""
        return self.nnodes * self.ndevices_per_node

    @property
    def dp(self) -> int:
        """Megatron data parallel size of the dense part."""
        return self.world_size // (self.tp * self.pp * self.cp)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for `plan --json`."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "gen_tp": self.gen_tp,
            "nnodes": self.nnodes,
            "ndevices_per_node": self.ndevices_per_node,
            "world_size": self.world_size,
            "dp": self.dp,
            "sources": dict(self.sources),
        }


def _pick(settings: Settings, name: str, default: int, label: str) -> tuple[int, str]:
    value = getattr(settings, name.lower())
    if value is None:
        return default, label
    return value, "environment"


def _layout_for(settings: Settings, device: Device, chip: Chip) -> ParallelLayout:
    """The sizes the settings give, each unset one filled with the device's (on npu, the chip's) default."""
    chosen: dict[str, int] = {}
    sources: dict[str, str] = {}
    if settings.profile == "smoke":
        # lazy: the smoke profile's modules import datasets and Pillow; only with PROFILE=smoke
        from recipe.smoke import SMOKE_LAYOUT

        defaults, label = dict(SMOKE_LAYOUT), "smoke profile"
    else:
        per_node = CHIPS[chip].devices_per_node if device == "npu" else DEFAULT_GPUS_PER_NODE
        defaults = {**DEVICE_DEFAULTS[device], **(CHIP_DEFAULTS[chip] if device == "npu" else {}), "NDEVICES_PER_NODE": per_node}
        label = f"default for {device}" + (f" ({chip})" if device == "npu" else "")
    for name, default in defaults.items():
        chosen[name], sources[name] = _pick(settings, name, default, label)
    sources["NNODES"] = "environment" if "NNODES" in settings.user_set() else "default"
    return ParallelLayout(
        tp=chosen["TP"],
        pp=chosen["PP"],
        cp=chosen["CP"],
        ep=chosen["EP"],
        etp=chosen["ETP"],
        gen_tp=chosen["GEN_TP"],
        nnodes=settings.nnodes,
        ndevices_per_node=chosen["NDEVICES_PER_NODE"],
        sources=sources,
    )


def _all_problems(layout: ParallelLayout, model: ModelArchitecture, settings: Settings, device: Device) -> list[str]:
    return layout_problems(layout, model, settings, DYNAMIC_BATCHING[device]) + known_failure_problems(
        layout, model, settings, device
    )


def _other_chip_hint(settings: Settings, model: ModelArchitecture, chip: Chip) -> str | None:
    """On npu, when the other chip's defaults would make this layout sound: say so, and what to set."""
    for other in CHIPS:
        if other == chip or not CHIP_DEFAULTS[other].keys() - settings.user_set():
            continue
        candidate = _layout_for(settings, "npu", other)
        if not _all_problems(candidate, model, settings, "npu"):
            changed = " ".join(f"{name}={CHIP_DEFAULTS[other][name]}" for name in sorted(CHIP_DEFAULTS[other]))
            return (
                f"CANN_CHIP: planned for {chip} ({CHIPS[chip].product}); on {other} ({CHIPS[other].product}) the "
                f"defaults ({changed}) fit this layout: set CANN_CHIP={other} if the node is one, else set {changed}"
            )
    return None


def resolve_layout(
    settings: Settings, device: Device, model: ModelArchitecture, chip: Chip = DEFAULT_CHIP
) -> ParallelLayout:
    """Fill unset sizes with the device's defaults (on npu, NDEVICES_PER_NODE is the chip's), then check every rule.

    Raises RecipeConfigError with one line per violated rule (on npu, and a line saying so when the
    other chip's defaults would fit).
    """
    layout = _layout_for(settings, device, chip)
    problems = _all_problems(layout, model, settings, device)
    if problems and device == "npu" and settings.profile != "smoke":
        hint = _other_chip_hint(settings, model, chip)
        problems += [hint] if hint else []
    if problems and settings.profile == "smoke":
        hint = _smoke_layout_hint(settings)
        problems += [hint] if hint else []
    if problems:
        raise RecipeConfigError(problems)
    return layout


def _smoke_layout_hint(settings: Settings) -> str | None:
    """PROFILE=smoke with a layout of the user's (a full run's .env): name the collision and its two ways out."""
    from recipe.smoke import SMOKE_LAYOUT  # lazy: the smoke profile's modules, only with PROFILE=smoke

    mine = [name for name in SMOKE_LAYOUT if name in settings.user_set()]
    if not mine:
        return None
    own = " ".join(f"{name}={value}" for name, value in SMOKE_LAYOUT.items())
    set_here = " ".join(f"{name}={getattr(settings, name.lower())}" for name in mine)
    return (f"PROFILE=smoke: trains its own tiny model on its own layout ({own}), and {set_here} (set here, e.g. "
            "in .env for the full run) replace it; unset them for the smoke run, or set PROFILE=full")


def layout_problems(
    layout: ParallelLayout, model: ModelArchitecture, settings: Settings, dynamic_batching: bool
) -> list[str]:
    """Every rule the layout breaks, one message each (empty when the layout is sound)."""
    tp, pp, cp, ep, etp, gen_tp = layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.gen_tp
    world = layout.world_size
    where = f"{world} devices (NNODES={layout.nnodes} x NDEVICES_PER_NODE={layout.ndevices_per_node})"
    problems: list[str] = []

    def rule(broken: bool, message: str) -> None:
        if broken:
            problems.append(message)

    # Megatron: attention heads are split across tensor-parallel ranks.
    rule(
        model.num_attention_heads % tp != 0,
        f"TP={tp}: must divide the model's {model.num_attention_heads} attention heads",
    )
    kv = model.num_kv_heads
    rule(
        kv % tp != 0 and tp % kv != 0,
        f"TP={tp}: must be a multiple or a divisor of the model's {kv} KV heads (query groups)",
    )
    # Megatron's Gated DeltaNet splits its key and value heads over TP x CP.
    for heads, kind in ((model.linear_key_heads, "key"), (model.linear_value_heads, "value")):
        rule(
            heads > 0 and heads % (tp * cp) != 0,
            f"TP={tp}, CP={cp}: TP x CP = {tp * cp} must divide the model's {heads} linear-attention {kind} heads",
        )
    rule(model.num_experts % ep != 0, f"EP={ep}: must divide the model's {model.num_experts} experts")
    rule(
        model.moe_ffn_hidden_size % etp != 0,
        f"ETP={etp}: must divide the model's expert hidden size {model.moe_ffn_hidden_size}",
    )
    rule(model.num_layers % pp != 0, f"PP={pp}: must divide the model's {model.num_layers} layers")
    rule(
        world % (tp * pp * cp) != 0,
        f"TP={tp}, PP={pp}, CP={cp}: TP x PP x CP = {tp * pp * cp} must divide the world size of {where}",
    )
    rule(
        world % (ep * etp * pp) != 0,
        f"EP={ep}, ETP={etp}, PP={pp}: EP x ETP x PP = {ep * etp * pp} must divide the world size of {where}",
    )
    # vLLM: the rollout's tensor-parallel group splits heads too, and verl tiles replicas over all devices.
    rule(world % gen_tp != 0, f"GEN_TP={gen_tp}: must divide the world size of {where}")
    rule(
        model.num_attention_heads % gen_tp != 0,
        f"GEN_TP={gen_tp}: must divide the model's {model.num_attention_heads} attention heads (vLLM)",
    )
    # verl (utils/config.py validate_config): without dynamic batching, the batch of
    # train_batch_size x rollout.n samples is split evenly over the data-parallel ranks.
    if not dynamic_batching and world % (tp * pp * cp) == 0:
        samples = settings.train_batch_size * settings.rollout_n
        rule(
            samples % layout.dp != 0,
            f"TRAIN_BATCH_SIZE={settings.train_batch_size}, ROLLOUT_N={settings.rollout_n}: their product {samples} "
            f"must be divisible by the data-parallel size {layout.dp} ({world} devices / TP x PP x CP)",
        )
    # Several nodes need to find each other (the rules live with the Ray bootstrap).
    problems.extend(
        cluster_problems(layout.nnodes, settings.node_rank, settings.master_addr, settings.ray_port, settings.ray_address)
    )
    problems.extend(
        ray_auth_problems(layout.nnodes, settings.ray_address, settings.ray_auth_mode, settings.ray_auth_token is not None)
    )
    return problems


#: vllm-ascend fails to load Qwen3.5-35B-A3B with rollout TP 4 (see DEVICE_DEFAULTS).
GEN_TP4_ISSUE = "vllm-ascend#10014"


def known_failure_problems(
    layout: ParallelLayout, model: ModelArchitecture, settings: Settings, device: Device
) -> list[str]:
    """Layouts that divide but that upstream reports failing for this model on this target; ALLOW_UPSTREAM_ISSUE lets one through."""
    # lazy: models is a room beside layout, read only for a known failure
    from recipe.models import QWEN3_5_35B_A3B

    this_model = replace(model, name=QWEN3_5_35B_A3B.name) == QWEN3_5_35B_A3B
    if device == "npu" and this_model and layout.gen_tp == 4 and GEN_TP4_ISSUE not in settings.allowed_upstream_issues:
        return [
            f"GEN_TP=4: vllm-ascend fails to load Qwen3.5-35B-A3B with rollout TP 4 (an NZ-format matmul on a "
            f"[2048, 1] weight: {GEN_TP4_ISSUE}, vllm-ascend#11621; verl's A3 settings moved to 8, verl#6972); "
            f"use GEN_TP=8, or set ALLOW_UPSTREAM_ISSUE={GEN_TP4_ISSUE} to try a vllm-ascend that fixes it"
        ]
    return []
