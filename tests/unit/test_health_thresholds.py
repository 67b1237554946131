"""HEALTH_THRESHOLDS: where run health's signs start, `name=value` pairs over the defaults, parsed by pydantic's model
of the bounds (recipe.run.health.Thresholds) and refused as any setting is: exit 2, one line naming the variable,
its value and the rule, nothing started, no secret repeated."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from recipe import cli
from recipe.errors import RecipeConfigError
from recipe.run.health import MAX_THRESHOLDS_TEXT, Thresholds, parse_thresholds, thresholds_text
from recipe.settings import load_settings


NAMES = list(Thresholds.model_fields)
#: Each bound's edges: (name, the last value taken, the first refused, the rule).
EDGES = [
    ("clipped_share", "0.999", "1", "input should be less than 1"),
    ("clipped_share", "1e-9", "0", "input should be greater than 0"),
    ("entropy_fall", "0.5", "1.0", "input should be less than 1"),
    ("flat_steps", "2", "1", "input should be greater than or equal to 2"),
    ("flat_steps", "100000", "100001", "input should be less than or equal to 100000"),
    ("flat_span", "1e-12", "0", "input should be greater than 0"),
    ("mismatch_kl", "1e300", "inf", "input should be a finite number"),
    ("mismatch_abs", "0.3", "nan", "input should be a finite number"),
    ("mismatch_rising_steps", "3", "2.5", "input should be a valid integer, unable to parse string as an integer"),
]


def _valid() -> st.SearchStrategy[Thresholds]:
    share = st.floats(min_value=1e-6, max_value=0.999, allow_nan=False)
    positive = st.floats(min_value=1e-12, max_value=1e12, allow_nan=False)
    steps = st.integers(min_value=2, max_value=100_000)
    return st.builds(Thresholds, clipped_share=share, entropy_fall=share, flat_steps=steps, flat_span=positive,
                     mismatch_kl=positive, mismatch_abs=positive, mismatch_rising_steps=steps)  # fmt: skip


@given(_valid())
def test_every_bound_written_is_read_back_the_same(bounds: Thresholds) -> None:
    assert parse_thresholds(thresholds_text(bounds)) == bounds


@given(bounds=_valid(), data=st.data())
def test_any_pairs_in_any_order_with_spaces_change_those_bounds_and_keep_the_defaults(
    bounds: Thresholds, data: st.DataObject
) -> None:
    chosen = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, unique=True))
    pad = data.draw(st.sampled_from(["", " ", "  "]))
    text = ",".join(f"{pad}{name}{pad}={pad}{getattr(bounds, name)!r}{pad}" for name in chosen)
    parsed = parse_thresholds(text)
    assert parsed == Thresholds(**{name: getattr(bounds, name) for name in chosen})
    assert all(getattr(parsed, name) == getattr(Thresholds(), name) for name in NAMES if name not in chosen)


@pytest.mark.parametrize(("name", "taken", "refused", "rule"), EDGES, ids=[f"{e[0]}={e[2]}" for e in EDGES])
def test_each_bound_takes_its_last_value_and_refuses_the_next_with_its_rule(
    name: str, taken: str, refused: str, rule: str
) -> None:
    assert getattr(parse_thresholds(f"{name}={taken}"), name) == float(taken)
    with pytest.raises(ValueError) as error:
        parse_thresholds(f"{name}={refused}")
    assert str(error.value) == f"{name}={refused!r}: {rule}"


@pytest.mark.parametrize(("text", "rule"), [
    ("mismatch_k=0.1", "'mismatch_k' is no health bound; did you mean mismatch_kl? the bounds are " + ", ".join(NAMES)),
    ("Flat_Steps=3", "'Flat_Steps' is no health bound; did you mean flat_steps? the bounds are " + ", ".join(NAMES)),
    ("kl=0.1", "'kl' is no health bound; the bounds are " + ", ".join(NAMES)),
    ("flat_steps=3,flat_steps=4", "flat_steps is given twice"),
    ("flat_steps", "must be name=value pairs separated by commas (e.g. mismatch_kl=0.005); not 'flat_steps'"),
    ("flat_steps=", "must be name=value pairs separated by commas (e.g. mismatch_kl=0.005); not 'flat_steps='"),
    ("=3", "must be name=value pairs separated by commas (e.g. mismatch_kl=0.005); not '=3'"),
    ("flat_steps=3,", "must be name=value pairs separated by commas (e.g. mismatch_kl=0.005); not ''"),
    ("flat_steps=3;mismatch_kl=1", "flat_steps='3;mismatch_kl=1': input should be a valid integer, unable to parse "
                                   "string as an integer"),
    ("x" * (MAX_THRESHOLDS_TEXT + 1), f"must be at most {MAX_THRESHOLDS_TEXT} characters"),
])  # fmt: skip
def test_a_text_that_is_not_the_bounds_is_refused_saying_what_is_wrong(text: str, rule: str) -> None:
    at_bound = "mismatch_kl=0.005".ljust(MAX_THRESHOLDS_TEXT)
    assert len(at_bound) == MAX_THRESHOLDS_TEXT and parse_thresholds(at_bound).mismatch_kl == 0.005
    with pytest.raises(ValueError) as error:
        parse_thresholds(text)
    assert str(error.value) == rule


@given(st.text(max_size=80))
@example("mismatch_kl=0.005")
@example("flat_steps=1e3")
@example("clipped_share=0x1p-2")
@example("mismatch_kl=1_0")
def test_any_text_is_bounds_or_one_value_error(text: str) -> None:
    """Hostile text: a Thresholds or a ValueError, never another exception (pydantic's parse, not ours)."""
    try:
        bounds = parse_thresholds(text)
    except ValueError as error:
        assert str(error)
    else:
        assert isinstance(bounds, Thresholds)
        assert all(math.isfinite(float(getattr(bounds, name))) for name in NAMES)


def test_the_setting_holds_every_bound_and_unset_is_the_defaults(gpu_env: pytest.MonkeyPatch) -> None:
    assert load_settings().health_thresholds is None and load_settings().thresholds == Thresholds()
    gpu_env.setenv("HEALTH_THRESHOLDS", " mismatch_kl = 0.005 ")
    settings_ = load_settings()
    assert settings_.thresholds == Thresholds(mismatch_kl=0.005)
    assert settings_.health_thresholds == thresholds_text(Thresholds(mismatch_kl=0.005))  # what plan shows, and keeps


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=34,
                      max_size=37).map("hf_{}".format),
       form=st.sampled_from(["{s}", "mismatch_kl={s}", "{s}=1", "flat_steps=3,{s}", "HF_TOKEN={s}"]))  # fmt: skip
def test_a_refused_value_never_repeats_a_secret_pasted_into_it(
    gpu_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, secret: str, form: str
) -> None:
    """A token pasted into the wrong variable: `plan` refuses it, exit 2, and no line repeats it."""
    gpu_env.setenv("HEALTH_THRESHOLDS", form.format(s=secret))
    with pytest.raises(RecipeConfigError) as refused:
        load_settings()
    assert secret not in str(refused.value)
    assert cli.main(["plan"]) == 2
    said = "".join(capsys.readouterr())
    assert "HEALTH_THRESHOLDS=" in said and secret not in said
    assert not (tmp_path / "checkpoints").exists()


def test_plan_refuses_bad_bounds_with_exit_2_and_one_line(gpu_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_env.setenv("HEALTH_THRESHOLDS", "mismatch_kl=-1")
    assert cli.main(["plan"]) == 2
    err = capsys.readouterr().err
    assert "HEALTH_THRESHOLDS='mismatch_kl=-1': mismatch_kl='-1': input should be greater than 0" in err
