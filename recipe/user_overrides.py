"""The user's overrides after `--`: read with Hydra's own parser and refused where they would undo a decision.

Refused: what Hydra rejects; a key a recipe setting decides, or a parent of one; a literal secret;
an interpolation that reads a secret from the environment. What passes is merged over the
recipe's own overrides (recipe.launch), each replacing the recipe's value for its key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from recipe.allocator import ALLOC_CONF_VARIABLES, RUNTIME_SWITCH_VARIABLE
from recipe.health_log import THRESHOLDS_VARIABLE
from recipe.errors import RecipeConfigError
from recipe.launch import _RAY_ENV, ALLOCATOR_POLICY, Override, _override_key
from recipe.redaction import (  # noqa: F401 - SECRET_VARIABLES, is_secret_key, is_secret_name, mask_url_password: this module's API too
    SECRET_VARIABLES,
    URL_WITH_PASSWORD,
    ends_assigning_a_secret,
    is_secret_key,
    is_secret_name,
    mask_url_password,
    may_hold_a_secret,
    redact,
)

#: Config keys whose children are environment variables (Ray's runtime_env.env_vars, ...): their
#: names follow is_secret_name in any case (github_token, hfToken), not is_secret_key.
_ENVIRONMENT_KEYS = frozenset({"env_vars", "env", "environment", "envs"})
# `${oc.env:NAME...}` (and OmegaConf 2.0's `${env:...}`), spaces allowed where OmegaConf allows them.
_ENV_READ = re.compile(r"\$\{\s*(?:oc\.env|env)\s*:\s*(?P<arg>[^,}]*)")
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def hydra_override_parser() -> Any | None:
    """Hydra's own override parser (what `python -m verl.trainer.main_ppo` parses argv with), or None without Hydra."""
    try:
        # lazy: hydra is heavy or absent where this module is imported; loaded only here
        from hydra.core.override_parser.overrides_parser import OverridesParser
    except ImportError:
        return None
    return OverridesParser.create()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _strings_in(value: Any) -> list[str]:
    """Every string inside a value Hydra parsed (dict keys included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for k, v in value.items() for text in (*_strings_in(k), *_strings_in(v))]
    if isinstance(value, (list, tuple)):
        return [text for v in value for text in _strings_in(v)]
    return []


def decided_keys(overrides: Sequence[Override]) -> dict[str, str]:
    """Every config key a recipe setting decides, with the setting to change instead."""
    decided = {o.key: o.setting for o in overrides if o.setting is not None}
    for variable in (*ALLOC_CONF_VARIABLES, RUNTIME_SWITCH_VARIABLE):
        decided[f"{_RAY_ENV}{variable}"] = ALLOCATOR_POLICY
    decided[f"{_RAY_ENV}{THRESHOLDS_VARIABLE}"] = "HEALTH_THRESHOLDS"  # the workers' copy of the setting
    return decided


def _decided_problem(text: str, targets: Sequence[str], decided: Mapping[str, str]) -> str | None:
    """Refusal of an override that sets, deletes or replaces a key a setting decides, or a parent of one."""
    for target in targets:
        if target in decided:
            return f"override {text!r}: {target} is decided by {decided[target]}; set that instead"
        parent_of = sorted(key for key in decided if target == "" or key.startswith(target + "."))
        if parent_of:
            settings = sorted({decided[key] for key in parent_of})
            return (
                f"override {text!r}: {target or 'the root of the config'} contains keys the recipe's settings decide "
                f"({', '.join(parent_of[:3])}{', ...' if len(parent_of) > 3 else ''}: set {'; '.join(settings)} instead); "
                "override the other keys under it one by one"
            )
        inside = next((key for key in decided if target.startswith(key + ".")), None)
        if inside is not None:
            return f"override {text!r}: {target} is inside {inside}, which {decided[inside]} decides; set that instead"
    return None


def secret_reference_problems(text: str, strings: Sequence[str]) -> list[str]:
    """Refusals of an override whose value reads a secret (or an unnamed variable) with oc.env."""
    problems: list[str] = []
    for string in strings:
        for match in _ENV_READ.finditer(string):
            name = match.group("arg").strip().strip("'\"").strip()
            if not _PLAIN_NAME.match(name):
                problems.append(
                    f"override {text!r}: oc.env must name its variable literally (a computed name could be a secret)"
                )
            elif is_secret_name(name):
                problems.append(
                    f"override {text!r}: reads the secret {name} through oc.env; a secret reaches verl only "
                    "through the environment, never its config (which verl prints and logs)"
                )
    return problems


@dataclass(frozen=True)
class UserOverride:
    """One override after `--` as Hydra's own parser reads it."""

    text: str
    #: The config path (or group) it names, dotted.
    key: str
    #: The package of a group override (`group@package=...`), else None.
    package: str | None
    #: Every string in its value, as Hydra hands them to OmegaConf.
    strings: tuple[str, ...]
    #: Secret names it sets a value for: a word of its key, or a key inside its value (is_secret_name).
    secrets_set: tuple[str, ...] = ()


def shown_override(text: str) -> str:
    """An override as a message quotes it: its value withheld when it may hold a secret.

    That is when a word of its key names a secret (is_secret_key), a word of its value could be
    a secret's name in any case (`{hfToken: ...}`, an unparseable dict), or it holds a URL with a
    password. A message about an override Hydra cannot parse must not repeat a secret in it.
    """
    key, _, value = text.partition("=")
    if "=" in text and (
        _secret_words(key)
        or any(is_secret_name(word) for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", value))
        or may_hold_a_secret(text)
    ):
        return repr(f"{key}=<value withheld: it may hold a secret>")
    return repr(redact(text))  # a text with no `=` can still hold a URL's password or a token


#: A key=value inside another override's value: two overrides in one argument, or a comma-separated list of them.
_ANOTHER_OVERRIDE = re.compile(r"(\s+|\s*,\s*)[~+]{0,2}[A-Za-z_][\w./@-]*=")


def override_slip(text: str) -> str | None:
    """What an everyday slip did to an override Hydra cannot parse, and its fix, in the recipe's words; None for
    any other text (Hydra's own reason is then said). The fix is shown as every override is (shown_override)."""
    key, _, value = text.partition("=")
    if not key.strip():
        return "has no key before `=` (the shell splits `key = value` into three arguments); write key=value"
    if key != key.rstrip():
        return f"has a blank before `=`, which Hydra cannot parse; write {shown_override(key.rstrip() + '=' + value.lstrip())}"
    found = _ANOTHER_OVERRIDE.search(value)
    if found is None:
        return None
    first, second = key + "=" + value[: found.start()], value[found.end(1):]
    if "," in found.group(1):
        return (f"holds overrides separated by a comma; separate them with blanks, {shown_override(first)} "
                f"{shown_override(second)} (OVERRIDES is split like a shell command line)")  # fmt: skip
    return (f"holds two overrides in one argument; give each its own, {shown_override(first)} {shown_override(second)} "
            "(quote each alone, not both together)")


def sweep_fix(key: str, value: str | None, kind: str | None) -> str:
    """What to write instead of a sweep, for what verl reads the key as (kind None: unknown). `value` is the text
    of a plain sweep (`a,b`), shown inside its fix; None for choice(), range() and glob(), whose fix is said."""
    if kind == "list":
        return f"{key} is a list in verl's config: write it in brackets, " + (
            shown_override(f"{key}=[{value}]") if value is not None else f"{key}=[a,b]")  # fmt: skip
    if kind in ("bool", "int", "float"):
        return f"{key} is {'an' if kind == 'int' else 'a'} {kind} in verl's config: give it one value (a run trains one configuration)"
    if kind == "text":
        return f"{key} is text in verl's config: quote the value" + (
            f", {shown_override(f'{key}={value!r}')}" if value is not None else "")  # fmt: skip
    return "write a list as [a,b] or quote the value"


def parse_user_override(text: str, parser: Any, kind_of: Callable[[str], str | None] | None = None) -> UserOverride | str:
    """The override as Hydra parses it, or one problem line (what Hydra rejects, plan rejects).

    kind_of tells what verl reads a key as (recipe.verl_config.key_kinds), so that a sweep's fix is one that works."""
    shown = shown_override(text)
    if "=" not in text and not text.startswith("~"):
        return f"override {shown}: must look like key=value (Hydra override syntax)"
    if text[:1].isspace():  # Hydra's own words: "token recognition error at: ' '"
        return f"override {shown}: starts with a blank, which Hydra cannot parse; write {shown_override(text.lstrip())}"

    def reason(error: BaseException) -> str:
        # Hydra's messages quote the text: where it holds a secret, only the kind of error is said.
        return _first_line(error) if shown == repr(text) else f"{type(error).__name__}; the value is not repeated"

    try:
        parsed = parser.parse_override(text)
    except Exception as error:  # Hydra's OverrideParseException, or whatever its grammar raises
        slip = override_slip(text)
        return f"override {shown}: {slip}" if slip else f"override {shown}: Hydra cannot parse it ({reason(error)})"
    if parsed.is_sweep_override():
        key, sweep = parsed.key_or_group.replace("/", "."), parsed.value()
        plain = text.partition("=")[2] if getattr(sweep, "simple_form", False) else None
        fix = sweep_fix(key, plain, kind_of(key) if kind_of and shown == repr(text) else None)
        return f"override {shown}: is a sweep, which Hydra refuses outside --multirun; {fix}"
    try:
        value = parsed.value()
    except Exception as error:
        return f"override {shown}: Hydra cannot evaluate its value ({reason(error)})"
    key = parsed.key_or_group.replace("/", ".")
    return UserOverride(
        text=text,
        key=key,
        package=parsed.package,
        strings=tuple(_strings_in(value)),
        secrets_set=tuple(_secrets_set(key, value)),
    )


def _key_words(key: str) -> list[str]:
    """The words of a config key (`+a.b[0]/c@d` -> a, b, 0, c, d)."""
    return [word for word in re.split(r"[.\[\]/@:+~]+", key) if word]


def _secret_words(key: str, in_environment: bool = False) -> list[str]:
    """The words of a config key that name a secret: is_secret_key, or is_secret_name under an environment dict."""
    words = _key_words(key)
    return [
        word
        for at, word in enumerate(words)
        if (is_secret_name(word) if in_environment or (at > 0 and words[at - 1] in _ENVIRONMENT_KEYS) else is_secret_key(word))
    ]


def _secrets_set(key: str, value: Any, in_environment: bool = False) -> list[str]:
    """The secret names an override gives a value to: any word of its key, or of a key of a dict in its value.

    Under an environment dict (_ENVIRONMENT_KEYS) a name is an environment variable's and follows
    is_secret_name in any case. A URL with a password is a secret whatever holds it.
    """
    words = _key_words(key)
    found = []
    if value not in (None, ""):
        found += _secret_words(key, in_environment)
        if not isinstance(value, (dict, list, tuple)) and URL_WITH_PASSWORD.search(str(value)):
            found.append(f"{words[-1] if words else 'a value'}{URL_SECRET}")
    inner_environment = in_environment or bool(words and words[-1] in _ENVIRONMENT_KEYS)
    if isinstance(value, dict):
        for name, inner in value.items():
            found += _secrets_set(str(name), inner, inner_environment)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            found += _secrets_set("", inner, inner_environment)
    return found


def literal_secret_problems(override: UserOverride) -> list[str]:
    """Refusals of an override that gives a secret a literal value (the line names the key, never the value).

    The override text is written into the run record (twice) and printed in `Executing:`; a
    secret belongs in the environment, which `run` hands to the trainer and every Ray worker
    and never records.
    """
    last = (_key_words(override.key) or [""])[-1]
    problems = []
    for name in dict.fromkeys(override.secrets_set):
        if name.endswith(URL_SECRET):
            problems.append(url_advice(override.key, whole_value=name == last + URL_SECRET))
        else:
            problems.append(
                f"override of {override.key}: gives the secret {name} a value in an override, where it would be "
                f"recorded in run-record.json and printed; set the environment variable {name} instead (`run` passes "
                "it to every Ray worker and never records it)"
            )
    return problems


#: How _secrets_set names a URL that carries its password.
URL_SECRET = " (a URL with its password)"


def url_advice(key: str, whole_value: bool) -> str:
    """The way out for a URL with its password: the override reads it from a variable of the user's own."""
    reference = "${oc.env:DB_URL}"
    how = (f"write '+{key.lstrip('+~')}={reference}' (without + where the key exists)" if whole_value
           else f"write {reference} where the URL stands in the value")  # fmt: skip
    return (
        f"override of {key}: gives it a URL with its password, which would be recorded in run-record.json and "
        f"printed; put the URL in an environment variable of your own (DB_URL, say: a name without TOKEN, SECRET, "
        f"PASS... in it) and {how}: the record keeps the reference, not the password, and `run` passes the variable "
        "to every Ray worker. verl prints its config resolved, the URL included: a backend that reads its password "
        "from a variable of its own keeps it out"
    )


def user_overrides(setting: Sequence[str], after_dashes: Sequence[str]) -> list[str]:
    """The user's overrides in the order they apply: OVERRIDES' first, then those after `--`.

    Both are the user's, read and recorded alike; for a key given in both, the one after `--`
    wins (the command line is the nearer, more specific place), and the OVERRIDES one is dropped
    so that Hydra never sees a key twice (`+key` twice is an error there).
    """
    given = {_override_key(text) for text in after_dashes}
    return [text for text in setting if _override_key(text) not in given] + list(after_dashes)


def check_user_overrides(
    overrides: Sequence[Override], extra: Sequence[str], kind_of: Callable[[str], str | None] | None = None
) -> tuple[list[str], list[str]]:
    """Split the user's extra overrides (after `--`) into (accepted, problem lines), in order.

    Each is read with Hydra's own parser, so what Hydra rejects is rejected here. Refused too:
    a key that a recipe setting decides, a parent of one (`trainer={...}`, `~trainer`), a group
    or package that replaces one, a literal value for a secret, and a value that reads a secret with oc.env. The composition
    against verl's own config is recipe.verl_config.verl_config_problems.
    """
    if not extra:
        return [], []
    parser = hydra_override_parser()
    if parser is None:
        return [], [
            f"your overrides ({len(extra)}): need Hydra (which comes with verl) to be checked the way the "
            "trainer reads them; run `plan` in the image (docker compose run --rm gpu plan -- ...), "
            "or pip install '.[trainer]'"
        ]
    decided = decided_keys(overrides)
    accepted: list[str] = []
    problems: list[str] = []
    after_withheld = False
    for number, text in enumerate(extra, start=1):
        # A word with no `=` right after an override whose value is withheld (or empty, for a secret's name) may be
        # the rest of that value, split at a blank or a line break (HF_TOKEN={a: s3cret}, hf_token=<newline>s3cret):
        # it is named by its place, never quoted.
        if after_withheld and "=" not in text and not text.startswith("~"):
            problems.append(f"override {number} (a word with no `=`, after an override whose value is withheld): "
                            "must look like key=value; a value with blanks goes in quotes")
            continue
        after_withheld = shown_override(text) != repr(text) or ends_assigning_a_secret(text)
        parsed = parse_user_override(text, parser, kind_of)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        targets = [parsed.key] + ([parsed.package] if parsed.package is not None else [])
        decided_problem = _decided_problem(text, targets, decided)
        # A secret's refusal first and alone: every other message quotes the override, value and all.
        refused = literal_secret_problems(parsed) or (
            [decided_problem] if decided_problem else secret_reference_problems(text, parsed.strings)
        )
        if refused:
            problems.extend(refused)
        else:
            accepted.append(text)
    return accepted, problems


def merge_user_overrides(overrides: Sequence[Override], extra: Sequence[str]) -> list[str]:
    """Apply the user's extra overrides (after `--`): each replaces the recipe's value for its key.

    What check_user_overrides refuses raises RecipeConfigError (every problem at once), so that
    the plan and the run never disagree.
    """
    accepted, problems = check_user_overrides(overrides, extra)
    if problems:
        raise RecipeConfigError(problems)
    by_key = {o.key: o for o in overrides}
    replaced: dict[str, str] = {}
    appended: list[str] = []
    for text in accepted:
        key = _override_key(text)
        if key in by_key:
            replaced[key] = text
        else:
            appended.append(text)
    return [replaced.get(o.key, str(o)) for o in overrides] + appended
