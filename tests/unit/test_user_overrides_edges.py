"""recipe/user_overrides.py at its edges (issue 52): URL credentials without a user name, named rather than drawn.

test_user_overrides.py draws the user name of a URL with its password (hypothesis, `[a-z]{0,6}`), so the empty one
came up only by chance; here it is a case of its own, with the lines a user reads, word for word.
"""

from __future__ import annotations

import pytest

from tests.support.needs import TRAINER_EXTRA, needs

needs("hydra", install=TRAINER_EXTRA)

from recipe.user_overrides import check_user_overrides, shown_override, url_advice  # noqa: E402

PASSWORD = "pw123"
WITHHELD = "'+a.url=<value withheld: it may hold a secret>'"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # scheme://:password@host: a password with no user name (Redis' AUTH, many DSNs) is a password all the same.
        ("+a.url='postgres://:pw123@db:5432/x'", url_advice("a.url", whole_value=True)),
        ("+a.url=redis://:pw123@cache", url_advice("a.url", whole_value=True)),
        ("a.url='https://:pw123@h'", url_advice("a.url", whole_value=True)),
        ("+a.urls=['redis://:pw123@cache']", url_advice("a.urls", whole_value=False)),
        ("+a.conf={backend: 'redis://:pw123@cache'}", url_advice("a.conf", whole_value=False)),
        # Hydra cannot parse it (a quote left open): the line says so without repeating the value.
        ("+a.url='postgres://:pw123@db", f"override {WITHHELD}: Hydra cannot parse it (HydraException; the value is not repeated)"),
    ],
)  # fmt: skip
def test_a_url_with_a_password_and_no_user_name_is_refused_and_never_repeated(text: str, problem: str) -> None:
    accepted, problems = check_user_overrides([], [text])
    assert (accepted, problems) == ([], [problem])
    assert PASSWORD not in problems[0]
    assert PASSWORD not in shown_override(text)


@pytest.mark.parametrize(
    "text",
    ["+a.url='postgres://user@db:5432/x'", "+a.url='postgres://:@db/x'", "+a.url='postgres://db:5432/x'",
     "+a.url='https://h/x?a=b:c@d'"],
)  # fmt: skip
def test_a_url_without_a_password_passes_and_is_quoted_whole(text: str) -> None:
    """A user name alone, an empty password, none at all, a colon and @ past the host: no secret to withhold."""
    assert check_user_overrides([], [text]) == ([text], [])
    assert shown_override(text) == repr(text)


def test_the_url_advice_is_said_word_for_word() -> None:
    """The whole line a user reads for `+trainer.tracking_uri='https://:pw123@h'`: a URL with a password, no user."""
    assert check_user_overrides([], ["+trainer.tracking_uri='https://:pw123@h'"]) == ([], [
        "override of trainer.tracking_uri: gives it a URL with its password, which would be recorded in "
        "run-record.json and printed; put the URL in an environment variable of your own (DB_URL, say: a name without "
        "TOKEN, SECRET, PASS... in it) and write '+trainer.tracking_uri=${oc.env:DB_URL}' (without + where the key "
        "exists): the record keeps the reference, not the password, and `run` passes the variable to every Ray worker. "
        "verl prints its config resolved, the URL included: a backend that reads its password from a variable of its "
        "own keeps it out"
    ])  # fmt: skip


@pytest.mark.parametrize(("key", "written"), [("a.url", "+a.url"), ("++a.url", "+a.url"), ("~a.url", "+a.url"),
                                              ("XLA.url", "+XLA.url"), ("a.url_", "+a.url_")])  # fmt: skip
def test_the_url_advice_writes_the_key_with_one_plus(key: str, written: str) -> None:
    assert f"write '{written}=${{oc.env:DB_URL}}' (without + where the key exists)" in url_advice(key, whole_value=True)


def test_a_url_in_a_list_is_named_a_value() -> None:
    """A list holds no key to name the URL by: it is `a value`, and the advice is to replace it where it stands."""
    from recipe.user_overrides import URL_SECRET, hydra_override_parser, parse_user_override

    parsed = parse_user_override("+a.urls=['redis://:pw123@c', {x: 'https://:pw123@h'}]", hydra_override_parser())
    assert not isinstance(parsed, str)
    assert parsed.secrets_set == (f"a value{URL_SECRET}", f"x{URL_SECRET}")


def test_a_word_split_from_a_withheld_value_is_named_by_its_place_and_the_rest_still_judged() -> None:
    """`HF_TOKEN={a: s3cret}` unquoted: the shell makes two arguments; the second is never quoted, those after it are
    judged as usual (a deletion, with its `~` and no `=`, is no such word)."""
    withheld = "'+a.HF_TOKEN=<value withheld: it may hold a secret>'"
    assert check_user_overrides([], ["+a.HF_TOKEN={a:", "s3cret}", "~b.c", "x.y=1", "plain"]) == (
        ["~b.c", "x.y=1"],
        [
            f"override {withheld}: Hydra cannot parse it (HydraException; the value is not repeated)",
            "override 2 (a word with no `=`, after an override whose value is withheld): must look like key=value; "
            "a value with blanks goes in quotes",
            "override 'plain': must look like key=value (Hydra override syntax)",
        ],
    )
    # An override with its `=` right after a withheld one is an override of its own, judged as usual.
    assert check_user_overrides([], ["+a.HF_TOKEN={a:", "x.y=1"]) == (
        ["x.y=1"], [f"override {withheld}: Hydra cannot parse it (HydraException; the value is not repeated)"]
    )


def test_a_lowercase_secret_name_in_a_value_withholds_it() -> None:
    """`github_token` in a list (no `=` or `:` after it for redact to see): the value may be the secret's."""
    from recipe.user_overrides import shown_override

    assert shown_override("+a.b=[github_token]") == "'+a.b=<value withheld: it may hold a secret>'"
    assert shown_override("+a.b=[github]") == "'+a.b=[github]'"


@pytest.mark.parametrize(
    ("kind", "fix"),
    [
        ("int", "a.b is an int in verl's config: give it one value (a run trains one configuration)"),
        ("float", "a.b is a float in verl's config: give it one value (a run trains one configuration)"),
        ("bool", "a.b is a bool in verl's config: give it one value (a run trains one configuration)"),
    ],
)
def test_a_sweep_of_a_number_says_an_int_or_a_float(kind: str, fix: str) -> None:
    from recipe.user_overrides import sweep_fix

    assert sweep_fix("a.b", "1,2", kind) == fix


def test_a_sweep_of_a_group_path_and_a_quoted_equals_sign_is_fixed_as_written() -> None:
    """`a/b=x,y` names the key a.b; `'x=1',y` keeps its `=` inside the brackets of the fix."""
    from recipe.user_overrides import hydra_override_parser, parse_user_override

    kinds: dict[str, str] = {"a.b": "list"}
    assert parse_user_override("a/b=x,y", hydra_override_parser(), kinds.get) == (
        "override 'a/b=x,y': is a sweep, which Hydra refuses outside --multirun; a.b is a list in verl's config: "
        "write it in brackets, 'a.b=[x,y]'"
    )
    assert parse_user_override("a.b='x=1',y", hydra_override_parser(), kinds.get) == (
        "override \"a.b='x=1',y\": is a sweep, which Hydra refuses outside --multirun; a.b is a list in verl's "
        "config: write it in brackets, \"a.b=['x=1',y]\""
    )


@pytest.mark.parametrize("text", ["='x", "=[", "=v,"])
def test_an_override_with_no_key_that_hydra_cannot_parse_says_so(text: str) -> None:
    from recipe.user_overrides import hydra_override_parser, parse_user_override

    assert parse_user_override(text, hydra_override_parser()) == (
        f"override {text!r}: has no key before `=` (the shell splits `key = value` into three arguments); write key=value"
    )


@pytest.mark.parametrize(("error", "line"), [(ValueError("  \n first \nsecond"), "first"), (ValueError(""), "ValueError"),
                                             (KeyError(), "KeyError")])  # fmt: skip
def test_a_parse_error_is_said_by_its_first_line_or_its_type(error: BaseException, line: str) -> None:
    from recipe.user_overrides import _first_line

    assert _first_line(error) == line
