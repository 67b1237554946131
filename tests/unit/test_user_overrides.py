"""recipe/user_overrides.py by direct calls: what the user passes after `--` is refused or merged, and how it is quoted.

Every override is read with Hydra's own override parser (what verl's main_ppo reads argv with);
nothing here composes verl's config or starts a process (tests/unit/test_hostile_overrides.py does,
against the real composition). The recipe's own overrides are hand-made here, with the settings
that decide them, so each message can be pinned word for word: users grep logs for them.

The secret rules are checked as families (hypothesis): a secret word anywhere in a variable's name
marks it, in any case and in camelCase; a literal secret is refused naming the variable to set,
its value nowhere in any message; a URL carrying its password is a secret whatever key holds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recipe.errors import RecipeConfigError
from recipe.launch import Override
from tests.support.needs import TRAINER_EXTRA, needs

needs("hydra", install=TRAINER_EXTRA)

from recipe.user_overrides import (
    UserOverride,
    check_user_overrides,
    decided_keys,
    hydra_override_parser,
    is_secret_key,
    is_secret_name,
    literal_secret_problems,
    merge_user_overrides,
    parse_user_override,
    secret_reference_problems,
    URL_SECRET,
    shown_override,
    url_advice,
)

PARSER = hydra_override_parser()
#: The allocator's policy as messages name it (the setting to change instead of these keys).
ALLOCATOR = "EXPANDABLE_SEGMENTS and PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF (the allocator policy)"
RAY_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
SWEEP = "is a sweep, which Hydra refuses outside --multirun; write a list as [a,b] or quote the value"
ONE_BY_ONE = "override the other keys under it one by one"
MEGATRON = "actor_rollout_ref.actor.megatron"

#: A recipe's own overrides, as recipe.launch builds them: some decided by a setting, some only tuned.
RECIPE = [
    Override("trainer.nnodes", "1", setting="NNODES"),
    Override("trainer.n_gpus_per_node", "8", setting="GPUS_PER_NODE"),
    Override(f"{MEGATRON}.tensor_model_parallel_size", "2", setting="TP"),
    Override(f"{MEGATRON}.pipeline_model_parallel_size", "1", setting="PP"),
    Override(f"{MEGATRON}.expert_model_parallel_size", "8", setting="EP"),
    Override("actor_rollout_ref.ref.megatron.tensor_model_parallel_size", "2", setting="TP"),
    Override("actor_rollout_ref.actor.optim.lr", "1e-06"),
    Override("ray_kwargs.ray_init.address", "'auto'", prefix="+"),
]


def _check(*extra: str) -> tuple[list[str], list[str]]:
    return check_user_overrides(RECIPE, list(extra))


def _withheld(key: str) -> str:
    return repr(f"{key}=<value withheld: it may hold a secret>")


def _secret_set(key: str, name: str) -> str:
    if name.endswith(URL_SECRET):  # the way out reads the URL from a variable of the user's own
        return url_advice(key, whole_value=name == key.rsplit(".", 1)[-1] + URL_SECRET)
    return (
        f"override of {key}: gives the secret {name} a value in an override, where it would be recorded in "
        f"run-record.json and printed; set the environment variable {name} instead (`run` passes it to every Ray "
        "worker and never records it)"
    )


def _reads_secret(text: str, name: str) -> str:
    return (
        f"override {text!r}: reads the secret {name} through oc.env; a secret reaches verl only "
        "through the environment, never its config (which verl prints and logs)"
    )


# --- which environment variable names are secrets ---------------------------------------------------------

#: The rule as is_secret_name's docstring (and docs) state it: words found anywhere in the name ...
ANYWHERE = ["TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL", "PRIVATE", "APIKEY", "API_KEY", "ACCESSKEY", "ACCESS_KEY"]
#: ... and words that count only as a whole underscore-separated word.
WHOLE_WORDS = ["KEY", "KEYS", "AUTH", "COOKIE", "SESSION", "PASS", "PWD", "DSN"]
#: Words of ordinary variables: none holds a secret word (checked by hand: no KEY, AUTH, PASS, ... inside).
PLAIN_WORDS = ["HOME", "PATH", "MY", "DB", "HOST", "PORT", "S3", "X1", "LOG", "LEVEL", "USER", "NAME", "DIR"]
_plain = st.lists(st.sampled_from(PLAIN_WORDS), max_size=2)
_CASES: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "lower": str.lower,
    # camelCase: each word after the first capitalised (mysqlPwd, hfToken), as JavaScript tools write them.
    "camel": lambda name: "".join(w.lower() if i == 0 else w.capitalize() for i, w in enumerate(name.split("_"))),
}


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"])
def test_the_secrets_the_recipe_knows_are_secret_names_and_keys_in_any_case(name: str) -> None:
    assert is_secret_name(name) and is_secret_name(name.lower())
    # hf_token, ray_auth_token: lower-case config keys that are plainly these secrets.
    assert is_secret_key(name) and is_secret_key(name.lower())


@given(word=st.sampled_from(ANYWHERE), before=st.sampled_from(["", "MY", "X_", "GH"]), after=st.sampled_from(["", "S", "_ID", "2"]))
def test_a_secret_word_inside_a_name_marks_it_even_glued_to_other_letters(word: str, before: str, after: str) -> None:
    """GITHUB_TOKEN, GHTOKENS, DB_PASSWORD, MYSECRET2: the word need not stand alone."""
    assert is_secret_name(before + word + after)
    assert is_secret_name((before + word + after).lower())


@given(word=st.sampled_from(WHOLE_WORDS), before=_plain, after=_plain, case=st.sampled_from(sorted(_CASES)))
def test_a_whole_secret_word_marks_a_name_first_last_or_inside_in_any_case(
    word: str, before: list[str], after: list[str], case: str
) -> None:
    name = _CASES[case]("_".join([*before, word, *after]))
    assert is_secret_name(name), name


@given(words=st.lists(st.sampled_from(PLAIN_WORDS), min_size=1, max_size=4), case=st.sampled_from(sorted(_CASES)))
def test_a_name_made_of_ordinary_words_is_not_a_secret(words: list[str], case: str) -> None:
    name = _CASES[case]("_".join(words))
    assert not is_secret_name(name) and not is_secret_key(name), name


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("SSHPASS", True),  # sshpass(1) reads SSHPASS: PASS at the end counts
        ("MYSQL_PWD", True),  # the MySQL client's password variable
        ("SENTRY_DSN", True),  # a DSN carries its credentials
        ("mysqlPwd", True),  # camelCase words are words
        ("s3Key", True),
        ("xAuth", True),
        ("sessionCookie", True),
        ("KEYBOARD_LAYOUT", False),  # KEY only as a prefix of a longer word
        ("MONKEY", False),
        ("HOST_KEYWORD", False),
        ("AUTHOR", False),
        ("PASSAGE_COUNT", False),  # PASS only at the start of a word
        ("SESSIONS", False),
        ("keyboardLayout", False),
        ("", False),
    ],
)
def test_secret_names_at_the_edges_of_the_rule(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        # Written like an environment variable: the name rule.
        ("MY_SERVICE_TOKEN", True),
        ("APP_SESSION", True),
        ("S3_KEY", True),
        # Lower case: a known secret, or an unmistakable secret word.
        ("hf_token", True),
        ("hugging_face_hub_token", True),
        ("ray_auth_token", True),
        ("api_key", True),
        ("apikey", True),
        ("db_password", True),
        ("my_passphrase", True),
        ("client_secret", True),
        ("gcp_credentials", True),
        ("private_key", True),
        ("privatekey", True),
        ("aws_access_key_id", True),
        ("accesskey", True),
        ("Db_Password", True),
        # verl's own lower-case keys are full of TOKEN, KEY, SESSION: not secrets.
        ("max_num_batched_tokens", False),
        ("ppo_max_token_len_per_gpu", False),
        ("skip_tokenizer_init", False),
        ("session_length", False),
        ("github_token", False),  # as a config key; under env_vars it is a variable's name (below)
        ("hfToken", False),
        ("private", False),
        ("HOME", False),
        ("", False),
    ],
)
def test_which_config_keys_hold_a_secret(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


# --- how an override is quoted in a message ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("trainer.total_epochs=3", "'trainer.total_epochs=3'"),
        ("+my_section={keyboard_layout: us}", "'+my_section={keyboard_layout: us}'"),
        ("+a.max_num_batched_tokens=8192", "'+a.max_num_batched_tokens=8192'"),
        ("+a.url='https://user@db.example/x'", '"+a.url=\'https://user@db.example/x\'"'),  # no password in it
        ("+a.url='https://db.example:5432/x'", '"+a.url=\'https://db.example:5432/x\'"'),
        # A config key in camelCase is not a variable's name (plan takes it as config), but a message withholds the
        # value of any name that may be a secret's (recipe.redaction): a word lost costs less than a secret shown.
        ("+a.hfToken=abc", _withheld("+a.hfToken")),
        ("~HF_TOKEN", "'~HF_TOKEN'"),  # a deletion has no value to withhold
        ("nonsense", "'nonsense'"),
        # A word of the key names a secret: the value is withheld, the key kept.
        (f"+{RAY_ENV}.HF_TOKEN=abc", _withheld(f"+{RAY_ENV}.HF_TOKEN")),
        ("+a.api_key=abc", _withheld("+a.api_key")),
        (f"+{RAY_ENV}.hfToken=abc", _withheld(f"+{RAY_ENV}.hfToken")),  # under env_vars: a variable's name
        ("+a.env.githubToken.x=abc", _withheld("+a.env.githubToken.x")),
        # A word of the value could name a secret (an unparseable dict), or the value is a URL with its password.
        ("+a={hfToken: abc", _withheld("+a")),
        ("+a=[x, MYSQL_PWD]", _withheld("+a")),
        ("+a.url='postgres://me:pw123@db.example/x'", _withheld("+a.url")),
        ("+a.url=postgres://:pw123@db", _withheld("+a.url")),
        ("+a=x=HF_TOKEN", _withheld("+a")),  # the key ends at the first `=`
    ],
)
def test_an_override_is_quoted_with_its_value_withheld_when_it_may_hold_a_secret(text: str, shown: str) -> None:
    assert shown_override(text) == shown


# --- what Hydra's parser reads --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "package", "strings"),
    [
        ("trainer.total_epochs=3", "trainer.total_epochs", None, ()),
        ("+a.b=x", "a.b", None, ("x",)),
        ("~trainer.val_before_train", "trainer.val_before_train", None, ()),
        ("actor@actor_rollout_ref.actor=megatron_actor", "actor", "actor_rollout_ref.actor", ("megatron_actor",)),
        ("a/b@c.d=v", "a.b", "c.d", ("v",)),  # a group's `/` is the config's `.`
        ("+a={k: v, n: 1}", "a", None, ("k", "v", "n")),  # dict keys are strings in it too
        ("+a=[1, {b: [c, 'd e']}, null]", "a", None, ("b", "c", "d e")),
        ("+a=str(7)", "a", None, ("7",)),
        ("+a=null", "a", None, ()),
    ],
)
def test_an_override_is_read_the_way_hydra_reads_it(text: str, key: str, package: str | None, strings: tuple[str, ...]) -> None:
    assert parse_user_override(text, PARSER) == UserOverride(text=text, key=key, package=package, strings=strings)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nonsense", "override 'nonsense': must look like key=value (Hydra override syntax)"),
        ("a=1 b=2", "override 'a=1 b=2': holds two overrides in one argument; give each its own, 'a=1' 'b=2' "
                    "(quote each alone, not both together)"),
        ("a='x", "override \"a='x\": Hydra cannot parse it (token recognition error at: ''x')"),
        # Hydra's message runs over several lines: only its first is kept (one problem, one line).
        ("a=foo(1)", "override 'a=foo(1)': Hydra cannot parse it (HydraException while evaluating 'foo(1)': Unknown function 'foo')"),
        ("trainer.total_epochs=1,2", f"override 'trainer.total_epochs=1,2': {SWEEP}"),
        ("a=choice(1,2)", f"override 'a=choice(1,2)': {SWEEP}"),
        # Hydra's own message would quote the secret: only the kind of error is said.
        (
            f"+{RAY_ENV}.HF_TOKEN='hf_abc",
            f"override {_withheld(f'+{RAY_ENV}.HF_TOKEN')}: Hydra cannot parse it (HydraException; the value is not repeated)",
        ),
        (f"+{RAY_ENV}.HF_TOKEN=hf_abc,hf_def", f"override {_withheld(f'+{RAY_ENV}.HF_TOKEN')}: {SWEEP}"),
    ],
)
def test_what_hydra_rejects_is_one_problem_line(text: str, problem: str) -> None:
    assert parse_user_override(text, PARSER) == problem
    assert _check(text) == ([], [problem])


# --- keys a recipe setting decides --------------------------------------------------------------------------


def test_the_decided_keys_are_the_settings_keys_and_the_workers_allocator_variables() -> None:
    # The allocator variables torch reads (PyTorch docs: PYTORCH_CUDA_ALLOC_CONF and its NPU, HIP and generic
    # twins), and the switch recipe.worker_setup reads in each Ray worker; the health bounds the workers' curves are
    # judged with (recipe.health_log), whether HEALTH_THRESHOLDS is set or not (unset: the defaults `run` uses).
    allocator = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                 "RECIPE_EXPANDABLE_SEGMENTS"]  # fmt: skip
    assert decided_keys(RECIPE) == {
        "trainer.nnodes": "NNODES",
        "trainer.n_gpus_per_node": "GPUS_PER_NODE",
        f"{MEGATRON}.tensor_model_parallel_size": "TP",
        f"{MEGATRON}.pipeline_model_parallel_size": "PP",
        f"{MEGATRON}.expert_model_parallel_size": "EP",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": "TP",
        **{f"{RAY_ENV}.{name}": ALLOCATOR for name in allocator},
        f"{RAY_ENV}.RECIPE_HEALTH_THRESHOLDS": "HEALTH_THRESHOLDS",
    }


#: The three decided keys under actor_rollout_ref.actor.megatron, sorted, as a parent's refusal lists them.
_MEGATRON_THREE = (
    f"{MEGATRON}.expert_model_parallel_size, {MEGATRON}.pipeline_model_parallel_size, {MEGATRON}.tensor_model_parallel_size"
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("trainer.nnodes=4", "override 'trainer.nnodes=4': trainer.nnodes is decided by NNODES; set that instead"),
        ("++trainer.nnodes=4", "override '++trainer.nnodes=4': trainer.nnodes is decided by NNODES; set that instead"),
        ("~trainer.nnodes", "override '~trainer.nnodes': trainer.nnodes is decided by NNODES; set that instead"),
        (
            f"+{RAY_ENV}.PYTORCH_HIP_ALLOC_CONF=expandable_segments:True",
            (
                f"override '+{RAY_ENV}.PYTORCH_HIP_ALLOC_CONF=expandable_segments:True': "
                f"{RAY_ENV}.PYTORCH_HIP_ALLOC_CONF is decided by {ALLOCATOR}; set that instead"
            ),
        ),
        # A parent: every decided key under it is named (three at most), with the settings to change.
        (
            "trainer={nnodes: 4}",
            (
                "override 'trainer={nnodes: 4}': trainer contains keys the recipe's settings decide "
                f"(trainer.n_gpus_per_node, trainer.nnodes: set GPUS_PER_NODE; NNODES instead); {ONE_BY_ONE}"
            ),
        ),
        (
            f"~{MEGATRON}",
            (
                f"override '~{MEGATRON}': {MEGATRON} contains keys the recipe's settings decide "
                f"({_MEGATRON_THREE}: set EP; PP; TP instead); {ONE_BY_ONE}"
            ),
        ),
        (
            "actor_rollout_ref={}",
            (
                "override 'actor_rollout_ref={}': actor_rollout_ref contains keys the recipe's settings decide "
                f"({_MEGATRON_THREE}, ...: set EP; PP; TP instead); {ONE_BY_ONE}"
            ),
        ),
        (
            f"+{RAY_ENV}={{}}",
            (
                f"override '+{RAY_ENV}={{}}': {RAY_ENV} contains keys the recipe's settings decide "
                f"({RAY_ENV}.PYTORCH_ALLOC_CONF, {RAY_ENV}.PYTORCH_CUDA_ALLOC_CONF, {RAY_ENV}.PYTORCH_HIP_ALLOC_CONF, ...: "
                f"set {ALLOCATOR}; HEALTH_THRESHOLDS instead); {ONE_BY_ONE}"
            ),
        ),
        # A package that replaces a parent, or the root itself.
        (
            "megatron@actor_rollout_ref.ref.megatron=foo",
            (
                "override 'megatron@actor_rollout_ref.ref.megatron=foo': actor_rollout_ref.ref.megatron contains keys "
                "the recipe's settings decide (actor_rollout_ref.ref.megatron.tensor_model_parallel_size: set TP instead); "
                f"{ONE_BY_ONE}"
            ),
        ),
        (
            "=3",
            (
                "override '=3': the root of the config contains keys the recipe's settings decide "
                f"({_MEGATRON_THREE}, ...: set EP; {ALLOCATOR}; GPUS_PER_NODE; HEALTH_THRESHOLDS; NNODES; PP; TP instead); "
                    f"{ONE_BY_ONE}"
            ),
        ),
        # Inside a decided key.
        (
            "+trainer.nnodes.x=1",
            "override '+trainer.nnodes.x=1': trainer.nnodes.x is inside trainer.nnodes, which NNODES decides; set that instead",
        ),
    ],
)
def test_an_override_of_a_decided_key_its_parent_or_its_inside_is_refused_naming_the_setting(text: str, problem: str) -> None:
    assert _check(text) == ([], [problem])


@pytest.mark.parametrize(
    "text",
    [
        "trainer.nnodes_extra=1",  # a sibling whose name starts like a decided key
        "+trainer.nnode=1",
        "trainer.total_epochs=3",
        f"{MEGATRON}.use_distributed_optimizer=False",
        "actor_rollout_ref.actor.optim.lr=2e-6",  # tuned by the recipe, decided by no setting
        f"+{RAY_ENV}.MY_FLAG=1",
        "actor@actor_rollout_ref.rollout=vllm",
        "~trainer.val_before_train",
    ],
)
def test_a_key_no_setting_decides_passes(text: str) -> None:
    assert _check(text) == ([text], [])


# --- secrets -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("${oc.env:HF_TOKEN}", "HF_TOKEN"),
        ("${env:WANDB_API_KEY}", "WANDB_API_KEY"),  # OmegaConf 2.0's spelling
        ("${ oc.env : MY_PASSWORD }", "MY_PASSWORD"),
        ("${oc.env:'HF_TOKEN'}", "HF_TOKEN"),
        ('${oc.env: "HF_TOKEN" ,none}', "HF_TOKEN"),
        ("${oc.env:' HF_TOKEN '}", "HF_TOKEN"),
        ("prefix-${oc.env:S3_KEY,x}-suffix", "S3_KEY"),
        ("${oc.env:mysqlPwd}", "mysqlPwd"),
        ("${oc.env:XAPI_KEY_X}", "XAPI_KEY_X"),  # only quotes and spaces are taken off the name
    ],
)
def test_reading_a_secret_with_oc_env_is_refused_naming_it(text: str, name: str) -> None:
    assert secret_reference_problems("+a=...", [text]) == [_reads_secret("+a=...", name)]


def test_each_secret_read_and_each_computed_name_is_one_problem() -> None:
    computed = "override '+a=...': oc.env must name its variable literally (a computed name could be a secret)"
    strings = ["${oc.env:HOME} ${oc.env:HF_TOKEN}", "${oc.env:${n}}", "plain", "${oc.env:RAY_AUTH_TOKEN}", "${oc.env:}"]
    assert secret_reference_problems("+a=...", strings) == [
        _reads_secret("+a=...", "HF_TOKEN"), computed, _reads_secret("+a=...", "RAY_AUTH_TOKEN"), computed,
    ]  # fmt: skip


@pytest.mark.parametrize("text", ["${oc.env:HOME}", "${oc.env:RECIPE_TEST_STEPS,3}", "${oc.decode:'1'}", "$HF_TOKEN", "${HF_TOKEN}"])
def test_reading_an_ordinary_variable_or_another_resolver_passes(text: str) -> None:
    assert secret_reference_problems("+a=...", [text]) == []


def test_a_secret_read_anywhere_in_a_parsed_value_is_refused() -> None:
    text = "+a={k: ['${oc.env:HF_TOKEN}']}"
    assert _check(text) == ([], [_reads_secret(text, "HF_TOKEN")])
    assert _check("+a='${oc.env:HOME}'") == (["+a='${oc.env:HOME}'"], [])


@pytest.mark.parametrize(
    ("text", "key", "names"),
    [
        (f"+{RAY_ENV}.HF_TOKEN=abc", f"{RAY_ENV}.HF_TOKEN", ["HF_TOKEN"]),
        (f"+{RAY_ENV}.githubToken=abc", f"{RAY_ENV}.githubToken", ["githubToken"]),
        (f"+{RAY_ENV}.HF_TOKEN.part=abc", f"{RAY_ENV}.HF_TOKEN.part", ["HF_TOKEN"]),
        ("+a.HF_TOKEN.HF_TOKEN=abc", "a.HF_TOKEN.HF_TOKEN", ["HF_TOKEN"]),  # one line per secret
        ("+a.api_key=abc", "a.api_key", ["api_key"]),
        (f"+{RAY_ENV}={{hfToken: abc, MODE: x, db_pwd: y}}", RAY_ENV, ["hfToken", "db_pwd"]),
        ("+a={inner: {HF_TOKEN: abc}}", "a", ["HF_TOKEN"]),
        # A dict under any environment-like key holds variables: their names follow the name rule in any case.
        ("+a={env: {hfToken: abc}}", "a", ["hfToken"]),
        ("+a.environment={hfToken: abc}", "a.environment", ["hfToken"]),
        ("+a.envs={hfToken: abc}", "a.envs", ["hfToken"]),
        ("+a.env=[{hfToken: abc}]", "a.env", ["hfToken"]),
        ("+a.env_vars={nested: {hfToken: abc}}", "a.env_vars", ["hfToken"]),
        ("+env.hfToken=abc", "env.hfToken", ["hfToken"]),  # the environment dict at the root
        ("+a.env=[{hfToken: abc}, {MYSQL_PWD: def}]", "a.env", ["hfToken", "MYSQL_PWD"]),  # every item of a list
        # A URL that carries its password, whatever key holds it.
        ("+a.db='postgres://me:pw123@db/x'", "a.db", ["db (a URL with its password)"]),
        ("+a=['redis://:pw123@cache']", "a", ["a value (a URL with its password)"]),
        ("+a={url: 'https://u:pw123@h'}", "a", ["url (a URL with its password)"]),
        ("db@pkg='postgres://me:pw123@db/x'", "db", ["db (a URL with its password)"]),
    ],
)
def test_a_literal_secret_is_refused_naming_the_variable_to_set(text: str, key: str, names: list[str]) -> None:
    assert _check(text) == ([], [_secret_set(key, name) for name in names])


@pytest.mark.parametrize(
    "text",
    [
        f"+{RAY_ENV}.HF_TOKEN=null",  # unsetting a secret sets nothing
        f"+{RAY_ENV}.HF_TOKEN=''",
        f"+{RAY_ENV}.HF_TOKEN=",
        f"~{RAY_ENV}.HF_TOKEN",
        "+a.hfToken=abc",  # a camelCase config key, not under an environment dict
        "+hfToken.env=abc",  # nor above one
        "+a={hfToken: abc}",
        "+a={session_length: 3, keyboard: us}",
        "+a.environment_name=hfToken",
        "+a.url='https://user@db/x'",
        "+a.db=[1, 2]",
        "+a.env={MODE: x}",
    ],
)
def test_no_secret_or_an_empty_one_passes(text: str) -> None:
    assert _check(text) == ([text], [])


_names = st.sampled_from(["HF_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN", "MY_SERVICE_PASSWORD", "S3_ACCESS_KEY", "MYSQL_PWD",
                          "SSHPASS", "SENTRY_DSN", "APP_SESSION"])  # fmt: skip
_values = st.from_regex(r"[A-Za-z0-9_]{8,20}", fullmatch=True)


@hsettings(max_examples=60)
@given(
    name=_names, value=_values, case=st.sampled_from(sorted(_CASES)),
    shape=st.sampled_from(["key", "dict", "list of dicts", "broken", "sweep", "unclosed dict"]),
)  # fmt: skip
def test_a_literal_secret_is_refused_and_its_value_never_repeated(name: str, value: str, case: str, shape: str) -> None:
    """Whatever shape it takes under env_vars, parseable or not, the value appears in no message."""
    variable = _CASES[case](name)
    text = {
        "key": f"+{RAY_ENV}.{variable}={value}",
        "dict": f"+{RAY_ENV}={{{variable}: {value}}}",
        "list of dicts": f"+a.env=[{{{variable}: {value}}}]",
        "broken": f"+{RAY_ENV}.{variable}='{value}",
        "sweep": f"+{RAY_ENV}.{variable}={value},other",
        "unclosed dict": f"+{RAY_ENV}={{{variable}:{value}",
    }[shape]
    accepted, problems = _check(text)
    assert accepted == [] and len(problems) == 1
    assert value not in problems[0]
    if shape in ("key", "dict", "list of dicts"):
        assert f"set the environment variable {variable} instead" in problems[0]


@hsettings(max_examples=40)
@given(
    scheme=st.sampled_from(["postgres", "https", "redis", "mongodb+srv", "s3"]),
    user=st.from_regex(r"[a-z]{0,6}", fullmatch=True),
    password=_values,
    key=st.sampled_from(["+a.url", "+a.endpoint", f"+{RAY_ENV}.DATABASE_URL"]),
)
def test_a_url_with_its_password_is_refused_and_never_repeated(scheme: str, user: str, password: str, key: str) -> None:
    url = f"{scheme}://{user}:{password}@db.example:5432/x"
    for text in (f"{key}='{url}'", f"{key}='{url}"):  # parseable, and not (an unbalanced quote)
        accepted, problems = _check(text)
        assert accepted == [] and len(problems) == 1 and password not in problems[0], problems
    word = key.rsplit(".", 1)[1]
    assert _check(f"{key}='{url}'")[1] == [_secret_set(key.lstrip("+"), f"{word} (a URL with its password)")]


def test_a_url_inside_a_value_is_replaced_where_it_stands_and_a_whole_value_by_the_override() -> None:
    (inside,) = _check("+a=['redis://:pw123@cache']")[1]
    assert "write ${oc.env:DB_URL} where the URL stands in the value" in inside and "pw123" not in inside
    (whole,) = _check("+trainer.tracking_uri='https://u:pw123@h'")[1]
    assert "write '+trainer.tracking_uri=${oc.env:DB_URL}'" in whole and "pw123" not in whole


def test_literal_secret_problems_names_each_secret_once() -> None:
    override = UserOverride(text="+a.B_TOKEN=x", key="a.B_TOKEN", package=None, strings=("x",), secrets_set=("B_TOKEN", "C_KEY", "B_TOKEN"))
    assert literal_secret_problems(override) == [_secret_set("a.B_TOKEN", "B_TOKEN"), _secret_set("a.B_TOKEN", "C_KEY")]


# --- the order of refusals ---------------------------------------------------------------------------------


def test_a_secret_refusal_comes_alone_so_no_other_message_quotes_its_value() -> None:
    # Also a decided key's inside, and a secret read: only the literal secret is said (the others quote the text).
    text = "+trainer.nnodes.HF_TOKEN=${oc.env:WANDB_API_KEY}x"
    assert _check(text) == ([], [_secret_set("trainer.nnodes.HF_TOKEN", "HF_TOKEN")])


def test_a_decided_key_is_refused_before_a_secret_read_is_looked_for() -> None:
    text = "trainer.nnodes=${oc.env:HF_TOKEN}"
    assert _check(text) == ([], ["override 'trainer.nnodes=${oc.env:HF_TOKEN}': trainer.nnodes is decided by NNODES; set that instead"])


def test_every_override_is_judged_in_order_and_every_problem_reported() -> None:
    extra = ["trainer.total_epochs=3", "nonsense", "+x=1", "trainer.nnodes=2", "+y=${oc.env:HF_TOKEN}"]
    assert _check(*extra) == (
        ["trainer.total_epochs=3", "+x=1"],
        [
            "override 'nonsense': must look like key=value (Hydra override syntax)",
            "override 'trainer.nnodes=2': trainer.nnodes is decided by NNODES; set that instead",
            _reads_secret("+y=${oc.env:HF_TOKEN}", "HF_TOKEN"),
        ],
    )


# --- without Hydra, and merging ------------------------------------------------------------------------------


def test_no_overrides_need_no_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hydra.core.override_parser.overrides_parser", None)  # import fails
    assert hydra_override_parser() is None
    assert check_user_overrides(RECIPE, []) == ([], [])
    assert merge_user_overrides(RECIPE, []) == [str(o) for o in RECIPE]


def test_overrides_without_hydra_are_refused_saying_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hydra.core.override_parser.overrides_parser", None)
    needs_hydra = (
        "your overrides (2): need Hydra (which comes with verl) to be checked the way the trainer reads them; "
        "run `plan` in the image (docker compose run --rm gpu plan -- ...), or pip install '.[trainer]'"
    )
    assert check_user_overrides(RECIPE, ["a=1", "b=2"]) == ([], [needs_hydra])


def test_hydras_parser_is_the_one_main_ppo_uses() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert isinstance(hydra_override_parser(), OverridesParser)


def test_a_user_override_replaces_the_recipes_value_in_place_and_new_keys_follow() -> None:
    merged = merge_user_overrides(RECIPE, ["+z=1", "++actor_rollout_ref.actor.optim.lr=2e-6", "ray_kwargs.ray_init.address=local", "+y=2"])
    assert merged == [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        f"{MEGATRON}.tensor_model_parallel_size=2",
        f"{MEGATRON}.pipeline_model_parallel_size=1",
        f"{MEGATRON}.expert_model_parallel_size=8",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
        "++actor_rollout_ref.actor.optim.lr=2e-6",
        "ray_kwargs.ray_init.address=local",
        "+z=1",
        "+y=2",
    ]


def test_the_last_override_of_a_key_wins() -> None:
    merged = merge_user_overrides(RECIPE, ["actor_rollout_ref.actor.optim.lr=1", "actor_rollout_ref.actor.optim.lr=2"])
    assert merged[6] == "actor_rollout_ref.actor.optim.lr=2" and len(merged) == len(RECIPE)


def test_merging_refuses_every_problem_at_once() -> None:
    with pytest.raises(RecipeConfigError) as caught:
        merge_user_overrides(RECIPE, ["trainer.nnodes=2", "+x=1", "nonsense"])
    assert caught.value.problems == [
        "override 'trainer.nnodes=2': trainer.nnodes is decided by NNODES; set that instead",
        "override 'nonsense': must look like key=value (Hydra override syntax)",
    ]


@hsettings(max_examples=30, deadline=None)
@given(blank=st.text(alphabet=" \t", min_size=1, max_size=3),
       text=st.sampled_from(["trainer.total_training_steps=3", "+trainer.my_note='a b'", "actor_rollout_ref.actor.optim.lr=2e-6"]))
def test_a_leading_blank_is_named_and_the_suggestion_parses(blank: str, text: str) -> None:
    """Hydra's "token recognition error at: ' '" becomes the override to write, which Hydra's parser takes."""
    problem = parse_user_override(blank + text, hydra_override_parser())
    assert problem == f"override {blank + text!r}: starts with a blank, which Hydra cannot parse; write {text!r}"
    assert isinstance(parse_user_override(text, hydra_override_parser()), UserOverride)
