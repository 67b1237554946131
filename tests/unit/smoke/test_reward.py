"""The smoke reward: the share of digits in a response, loaded and called the way verl's trainer does."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.needs import TRAINER_EXTRA, needs

from recipe.smoke import reward


@pytest.mark.parametrize(
    ("response", "score"),
    [("", 0.0), ("abc", 0.0), ("42", 1.0), ("#### 12", 2 / 7), ("1 + 1 = 2", 3 / 9), ("٣", 1.0),  # an Arabic-Indic digit is a digit
     ("   \n\t", 0.0), ("7 \n", 1 / 3)],  # whitespace only is no digit, and whitespace counts in the length (issue 52)
)  # fmt: skip
def test_the_score_is_the_share_of_digits(response: str, score: float) -> None:
    assert reward.compute_score("openai/gsm8k", response, "2") == pytest.approx(score)


@given(st.text(max_size=200))
@example("")  # the edges, named (issue 52): empty,
@example("   \n\t")  # whitespace only,
@example("0" * 200)  # all digits,
@example("\u0663\u0664")  # digits of another script
def test_the_score_is_a_share_and_ignores_the_truth(response: str) -> None:
    # A random model's answers must still differ in reward: the truth plays no part, and the score is in [0, 1].
    score = reward.compute_score("openai/gsm8k", response, "7", extra_info={"index": 0})
    assert 0.0 <= score <= 1.0
    assert score == reward.compute_score("other", response, "8")
    assert score == (sum(char.isdigit() for char in response) / len(response) if response else 0.0)


def test_verl_loads_it_by_the_path_and_name_the_smoke_profile_sets() -> None:
    needs("verl", install=TRAINER_EXTRA)
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": reward.__file__, "name": reward.FUNCTION}}})
    score = get_custom_reward_fn(config)
    assert score is not None
    # verl's reward loop calls it with these keywords (and may add more, which the function accepts).
    assert score(data_source="openai/gsm8k", solution_str="a1", ground_truth="1", extra_info={}, reward_router_address=None) == 0.5
