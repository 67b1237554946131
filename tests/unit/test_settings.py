"""Settings: parsing, defaults left unset for the layout, one error line per bad variable."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given, settings as hsettings, strategies as st

from recipe.errors import RecipeConfigError
from recipe.settings import REDACTED, Settings, load_settings

from .envtools import clear_settings

INTEGER_SETTINGS = ["TP", "PP", "CP", "EP", "ETP", "GEN_TP", "NNODES", "NDEVICES_PER_NODE", "TOTAL_EPOCHS"]


def test_defaults_leave_parallel_sizes_to_the_device(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.tp, settings.pp, settings.ep, settings.ndevices_per_node) == (None, None, None, None)
    assert settings.device == "auto"
    assert settings.user_set() == set()


def test_values_are_read_and_remembered_as_user_set(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TP", "4")
    clean_env.setenv("device", "npu")  # case-insensitive like pydantic-settings
    settings = load_settings()
    assert settings.tp == 4 and settings.device == "npu"
    assert settings.user_set() == {"TP", "DEVICE"}


def test_empty_value_means_unset(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TP", "")
    assert load_settings().tp is None


def test_data_files_default_to_where_prepare_data_writes(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATA_DIR", "/srv/data")
    settings = load_settings()
    assert str(settings.resolved_train_files) == "/srv/data/geo3k/train.parquet"
    assert str(settings.resolved_val_files) == "/srv/data/geo3k/test.parquet"


def test_every_bad_variable_is_reported_at_once(clean_env: pytest.MonkeyPatch) -> None:
    for name, value in {"TP": "abc", "PP": "0", "EP": "-8", "DEVICE": "tpu", "OFFLOAD": "maybe", "SAVE_FREQ": "0"}.items():
        clean_env.setenv(name, value)
    with pytest.raises(RecipeConfigError) as caught:
        load_settings()
    problems = caught.value.problems
    assert problems == [
        "DEVICE='tpu': must be one of 'auto', 'gpu' or 'npu'",
        "TP='abc': must be a whole number",
        "PP='0': must be a positive whole number",
        "EP='-8': must be a positive whole number",
        "SAVE_FREQ='0': must be a positive number of steps, or -1 to disable",
        "OFFLOAD='maybe': must be true or false",
    ]


def test_secrets_are_redacted(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HF_TOKEN", "hf_secret_value")
    clean_env.setenv("WANDB_API_KEY", "wandb_secret_value")
    shown = load_settings().redacted()
    assert shown["HF_TOKEN"] == REDACTED and shown["WANDB_API_KEY"] == REDACTED
    assert "secret_value" not in repr(shown)


_not_a_positive_int = st.one_of(
    st.integers(max_value=0).map(str),
    st.text(alphabet="abcxyz.-+ e", min_size=1).filter(lambda s: s.strip() and not s.strip().lstrip("+").isdigit()),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: f != int(f) if f == f and abs(f) != float("inf") else True).map(str),
)


@hsettings(max_examples=150, deadline=None)
@given(name=st.sampled_from(INTEGER_SETTINGS), value=_not_a_positive_int)
# 32 digits or more have a token's shape: the value is named withheld (recipe.redaction), the line still one.
@example(name="TP", value="-" + "1" + "0" * 31)
def test_any_non_positive_or_non_integer_size_is_one_line_naming_it(name: str, value: str) -> None:
    from recipe.redaction import redact

    with pytest.MonkeyPatch.context() as mp:
        clear_settings(mp)
        mp.setenv(name, value)
        with pytest.raises(RecipeConfigError) as caught:
            load_settings()
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith(f"{name}={redact(value)!r}: ")


# --- names almost like a setting's (issue 13, item 5) ------------------------------------------

#: What a shell, a container, CI, Kubernetes, Ray, the collectives and compose put in the environment.
USUAL_ENVIRONMENT = [
    "PATH", "HOME", "HOSTNAME", "LANG", "TERM", "SHLVL", "PWD", "OLDPWD", "USER", "SHELL", "VIRTUAL_ENV", "TZ",
    "CI", "TMPDIR", "LD_LIBRARY_PATH", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_NAME", "POD_NAME",
    "DEVICE_ID", "RAY_GCS_PORT", "RAY_NODE_IP", "NCCL_SOCKET_IFNAME", "HCCL_CONNECT_TIMEOUT", "CUDA_HOME",
    "HF_HOME", "NVIDIA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HOST_CHECKPOINTS_DIR", "HOST_DATA_DIR",
    "GPU_IMAGE", "NPU_IMAGE", "SHM_SIZE", "RESTART_POLICY", "HWHIAIUSER_GID", "TINI_SUBREAPER", "KUBERNETES_PORT",
]  # fmt: skip


def test_a_typo_of_a_setting_is_named_with_the_setting() -> None:
    from recipe.env_warnings import near_miss_warnings

    assert near_miss_warnings({"TPP": "2"}) == ["TPP is not a setting (ignored); did you mean TP?"]
    assert near_miss_warnings({"NNODE": "2"}) == ["NNODE is not a setting (ignored); did you mean NNODES?"]


def test_the_usual_environment_and_the_settings_themselves_never_warn() -> None:
    from recipe.env_warnings import near_miss_warnings
    from recipe.settings import Settings

    assert near_miss_warnings(dict.fromkeys(USUAL_ENVIRONMENT, "x")) == []
    assert near_miss_warnings({name.upper(): "1" for name in Settings.model_fields}) == []


LONG_NAMES = sorted(n.upper() for n in Settings.model_fields if len(n) >= 6 and not n.upper().startswith(("RAY_", "HF_", "WANDB_")))


@hsettings(max_examples=150, deadline=None)
@given(name=st.sampled_from(LONG_NAMES), data=st.data())
def test_any_one_letter_slip_in_a_long_name_is_caught(name: str, data: st.DataObject) -> None:
    from recipe.env_warnings import near_miss_warnings

    at = data.draw(st.integers(0, len(name) - 1))
    kind = data.draw(st.sampled_from(["drop", "double", "swap", "replace"]))
    letter = data.draw(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    typo = {
        "drop": name[:at] + name[at + 1 :],
        "double": name[:at] + name[at] + name[at:],
        "swap": name[:at] + name[at + 1 : at + 2] + name[at : at + 1] + name[at + 2 :],
        "replace": name[:at] + letter + name[at + 1 :],
    }[kind]
    assume(typo != name and typo.upper() not in {n.upper() for n in Settings.model_fields} and typo[:1].isalpha())
    warnings = near_miss_warnings({typo: "1"})
    assert len(warnings) == 1 and warnings[0].startswith(f"{typo} is not a setting (ignored); did you mean ")


@hsettings(max_examples=60, deadline=None)
@given(value=st.text(min_size=1, max_size=30).filter(lambda s: s.strip() and "\x00" not in s))
def test_allow_drift_takes_only_field_names(value: str) -> None:
    # Read by the real loader from the environment, as the entrypoint does.
    import re

    valid = all(re.fullmatch(r"[A-Za-z0-9_.]+", field.strip()) for field in value.split(","))
    with pytest.MonkeyPatch.context() as patch:
        clear_settings(patch)
        patch.setenv("ALLOW_DRIFT", value)
        if valid:
            assert load_settings().allowed_drift == [field.strip() for field in value.split(",")]
        else:
            with pytest.raises(RecipeConfigError) as caught:
                load_settings()
            assert any(p.startswith("ALLOW_DRIFT=") for p in caught.value.problems), caught.value.problems
