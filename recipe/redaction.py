"""What a message may repeat of a text the user gave: one redaction for every message that quotes one.

A message that quotes an override, a setting's value or a URL passes it through `redact` first,
whatever went wrong with it: a text that does not parse (an unbalanced quote, a stray `=`, a bad
escape, a newline) is exactly the one whose secret no parser has found yet. What `redact` withholds:

- the password of a URL (`scheme://user:password@host`, also without a user name);
- the value of an assignment (`NAME=value`, `name: value`; quoted, a dict or a list, closed or
  not, or a bare word) whose name, or a dotted word of it, names a secret (is_secret_key: HF_TOKEN, db_password,
  api_key, and any name ending in _token or _key; not verl's max_num_batched_tokens);
- a word shaped like a token: a Hugging Face token (`hf_` and 30 or more letters and digits), or a
  run of 32 or more hexadecimal digits (W&B's API key is 40).

It is a module of its own, below settings and the override checks, so that both can use it.
"""

from __future__ import annotations

import re

#: Secrets the recipe knows by name; any other variable whose name looks like one counts too.
SECRET_VARIABLES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "RAY_AUTH_TOKEN"})
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|PASS$"
    r"|(^|_)(KEYS?|AUTH|COOKIE|SESSION|PASS|PWD|DSN)(_|$)"
)
#: A URL that carries its password (scheme://user:password@host): a secret whatever key holds it.
URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@")
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")
#: NAME= or name: (the start of an assignment).
_ASSIGNMENT = re.compile(r"""(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<sep>\s*[=:]\s*)""")
#: An assignment's value: quoted, a dict or a list (each closed or not, blanks inside), or a bare word.
_VALUE = re.compile(r"""'[^']*(?:'|$)|"[^"]*(?:"|$)|\{[^}]*(?:\}|$)|\[[^\]]*(?:\]|$)|[^\s,;}\]]+""")
_TOKEN_SHAPES = re.compile(r"\bhf_[A-Za-z0-9]{30,}|(?<![0-9A-Fa-f])[0-9A-Fa-f]{32,}(?![0-9A-Fa-f])")
WITHHELD = "<withheld>"


def is_secret_name(name: str) -> bool:
    """Whether an environment variable of this name is treated as a secret.

    The rule: a known secret (SECRET_VARIABLES), or a name containing TOKEN, SECRET, PASSW,
    PASSPHRASE, CREDENTIAL, PRIVATE, APIKEY/API_KEY or ACCESS_KEY, ending in PASS (SSHPASS), or
    having KEY(S), AUTH, COOKIE, SESSION, PASS, PWD (MYSQL_PWD) or DSN as one of its
    underscore-separated words (case-insensitive; camelCase words count as words: mysqlPwd, hfToken).
    """
    upper = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper()
    return upper in SECRET_VARIABLES or bool(_SECRET_NAME.search(upper))


#: Words that name a secret in a config key of any case; the others (TOKEN, KEY, AUTH, SESSION, ...)
#: only in a name written like an environment variable, since verl's own lower-case keys are full
#: of them: max_num_batched_tokens, ppo_max_token_len_per_gpu, skip_tokenizer_init.
_SECRET_IN_ANY_CASE = re.compile(r"PASSW|PASSPHRASE|SECRET|CREDENTIAL|PRIVATE_?KEY|API_?KEY|ACCESS_?KEY")


def is_secret_key(name: str) -> bool:
    """Whether a config key (one word of an override's key, or a key inside its value) holds a secret.

    A name written like an environment variable (HF_TOKEN, MY_SERVICE_PASSWORD) follows
    is_secret_name; a lower-case one only when it is a known secret (hf_token) or holds an
    unmistakable secret word (api_key, db_password).
    """
    if not name or not is_secret_name(name):
        return False
    return name == name.upper() or name.upper() in SECRET_VARIABLES or bool(_SECRET_IN_ANY_CASE.search(name.upper()))


def mask_url_password(value: str | None) -> str | None:
    """`value` with the password of every URL in it written as ********: what the run record keeps of a variable."""
    return None if value is None else _URL_PASSWORD.sub(r"\1********\3", value)


#: In a message, also a lower-case name ending in _token or _key (github_token, service_key): withholding a
#: value that was not a secret costs a message a word, repeating one that was cannot be taken back.
_ENDS_LIKE_A_SECRET = re.compile(r"(^|_)(TOKEN|KEY)$")


def _names_a_secret(word: str) -> bool:
    """is_secret_key, a name ending like a secret, or a camelCase name that names one (hfToken, dbPassword)."""
    camel = re.search(r"[a-z0-9][A-Z]", word) is not None
    return is_secret_key(word) or bool(_ENDS_LIKE_A_SECRET.search(word.upper())) or (camel and is_secret_name(word))


def _withhold_secret_values(text: str) -> str:
    """TEXT with the value of every assignment to a secret name withheld. The value of any other name is read on
    from its start, so that a secret assigned inside it (`a={inner: {HF_TOKEN: x}}`) is found too."""
    out, at = [], 0
    while (match := _ASSIGNMENT.search(text, at)) is not None:
        words = [word for word in re.split(r"[.\-]+", match["name"]) if word]
        value = _VALUE.match(text, match.end())
        if value is None or not any(_names_a_secret(word) for word in words):
            out.append(text[at : match.end()])
            at = match.end()
            continue
        out.append(text[at : match.end()] + WITHHELD)
        at = value.end()
    return "".join(out) + text[at:]


def ends_assigning_a_secret(text: str) -> bool:
    """Whether TEXT ends with an assignment to a secret name whose value is not there (`hf_token=`): a word that
    follows it may be that value, split off at a blank or a line break."""
    match = re.search(r"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\s*[=:]\s*$", text)
    return match is not None and any(_names_a_secret(word) for word in re.split(r"[.\-]+", match["name"]) if word)


def redact(text: str) -> str:
    """TEXT as a message may quote it: URL passwords, the values of secret names and token-shaped words withheld."""
    masked = _URL_PASSWORD.sub(r"\1********\3", text)
    masked = _withhold_secret_values(masked)
    return _TOKEN_SHAPES.sub(WITHHELD, masked)


def may_hold_a_secret(text: str) -> bool:
    """Whether `redact` withholds anything of TEXT."""
    return redact(text) != text
