#!/usr/bin/env bash
# The README's test command: set up the tests' venv (.venv) and run the suite, on any x86_64 Linux
# machine with Python 3.11. Safe to rerun: each install step is skipped when what it installs is
# current, and every step says what it did.
#
#   bash tests/setup.sh                  # set up (or reuse) .venv, then pytest on every core
#   bash tests/setup.sh --e2e            # also .venv-e2e for the CPU end-to-end run (tests/e2e)
#   bash tests/setup.sh --no-tests       # set up only
#   bash tests/setup.sh -- -k layout     # what follows -- goes to pytest
#
# PYTHON picks the interpreter (default python3); TORCH_INDEX_URL a mirror of PyTorch's CPU index.
# Why each step is what it is: docs/testing.md ("The set-up, explained"). .ci/run calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
TORCH_VERSION=2.13.0
VENV=.venv
STAMPS="$VENV/.setup"

STARTED=$SECONDS
say() { printf '[setup] %s (%d s)\n' "$*" $((SECONDS - STARTED)); }
refuse() { printf 'setup: %s\n' "$*" >&2; exit 2; }

E2E=0 TESTS=1
PYTEST_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --e2e) E2E=1 ;;
        --no-tests) TESTS=0 ;;
        --) shift; PYTEST_ARGS=("$@"); break ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) refuse "unknown option $1 (options: --e2e, --no-tests, -- PYTEST_ARGS...)" ;;
    esac
    shift
done

# --- what this machine must be --------------------------------------------------------------------------------
machine="$(uname -m)"
[ "$machine" = x86_64 ] || refuse "this machine is $machine; the tests' set-up needs x86_64 Linux (PyTorch's CPU wheels and the tools' binaries of the test extra are x86_64 builds)"

command -v "$PYTHON" >/dev/null 2>&1 || refuse "PYTHON=$PYTHON: no such command; the tests need Python 3.11"
found="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)" \
    || refuse "PYTHON=$PYTHON does not run; the tests need Python 3.11"
if [ "${found%.*}" != 3.11 ]; then
    where="no pyenv here: install Python 3.11 and set PYTHON to it"
    if command -v pyenv >/dev/null 2>&1; then
        pyenv_311="$(ls -d "$(pyenv root)"/versions/3.11* 2>/dev/null | tail -n 1 || true)"
        where="pyenv's 3.11 would be at ${pyenv_311:-$(pyenv root)/versions/3.11.x (not installed: pyenv install 3.11)}/bin/python3"
    fi
    refuse "PYTHON=$PYTHON is Python $found ($(command -v "$PYTHON")); the tests need Python 3.11 (Megatron-Bridge's shims and the e2e's pins are for it); $where"
fi

# --- the steps --------------------------------------------------------------------------------------------------
sha() { cat "$@" | sha256sum | cut -c1-16; }
quietly() {  # quietly WHAT COMMAND...: pip's and the builds' chatter goes to a log, shown only when COMMAND fails
    local what="$1" log
    shift
    log="$(mktemp)"
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        printf 'setup: %s failed (its output above)\n' "$what" >&2
        exit 1
    fi
    rm -f "$log"
}
current() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp() { mkdir -p "$STAMPS" && printf '%s' "$2" >"$STAMPS/$1"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = 3.11 ]; then
    say "venv $VENV: reused"
else
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    say "venv $VENV: created with Python $found"
fi

# torch alone and first, and a CPU build: with no torch installed, a package that asks for it takes PyPI's CUDA
# build (several GB). pip resolves it once without installing, and the choice is checked before anything is.
torch_build() {  # prints the installed torch's version, or nothing
    "$VENV/bin/python" - <<'PY' 2>/dev/null || true
from importlib.metadata import PackageNotFoundError, requires, version
try:
    cuda = any(r.startswith("nvidia-") for r in requires("torch") or [])
    print(version("torch") + (" (a CUDA build)" if cuda else ""))
except PackageNotFoundError:
    pass
PY
}
installed_torch="$(torch_build)"
if [ "${installed_torch%+cpu}" = "$TORCH_VERSION" ] || [ "$installed_torch" = "$TORCH_VERSION+cpu" ]; then
    say "torch $installed_torch (CPU): current"
else
    # --retries 0: an unreachable index is one quick failure here, not five slow retries per package.
    torch_args=(--no-deps --retries 0 --timeout 20 --extra-index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION")
    report="$(mktemp)" log="$(mktemp)"
    trap 'rm -f "$report" "$log"' EXIT
    if ! "${PIP[@]}" install --quiet --dry-run --report "$report" "${torch_args[@]}" >"$log" 2>&1; then
        refuse "pip finds no torch==$TORCH_VERSION in any configured source: PyTorch's CPU index ($TORCH_INDEX_URL, TORCH_INDEX_URL) did not answer or lacks it, and pip's own sources (pip config list) do not have it ($log)"
    fi
    chosen="$("$VENV/bin/python" - "$report" <<'PY'
import json, sys
item = json.load(open(sys.argv[1]))["install"][0]
cuda = any(r.startswith("nvidia-") for r in item["metadata"].get("requires_dist") or [])
print(("cuda " if cuda else "cpu ") + item["metadata"]["version"] + " " + item["download_info"]["url"])
PY
)"
    read -r kind version url <<<"$chosen"
    [ "$kind" = cpu ] || refuse "pip finds only a CUDA build of torch==$TORCH_VERSION ($url); the tests need the CPU build from PyTorch's CPU index ($TORCH_INDEX_URL, TORCH_INDEX_URL), which did not answer or lacks it"
    quietly "pip's install of torch $version from $url" "${PIP[@]}" install --quiet "${torch_args[@]}"
    rm -f "$report" "$log"
    say "torch $version (CPU): installed from $url"
fi

# The recipe with its trainer and test extras. editable_mode=compat: docs/testing.md.
recipe_key="$(sha pyproject.toml)"
if current recipe "$recipe_key"; then
    say "recipe [trainer,test] (pyproject.toml $recipe_key): current"
else
    quietly "the recipe's install" "${PIP[@]}" install --quiet -e '.[trainer,test]' --config-settings editable_mode=compat
    stamp recipe "$recipe_key"
    say "recipe [trainer,test] (pyproject.toml $recipe_key): installed, editable"
fi

bridge_key="$(sha .ci/install-megatron-bridge.sh)"
if current megatron-bridge "$bridge_key"; then
    say "Megatron-Bridge (.ci/install-megatron-bridge.sh $bridge_key): current"
else
    PIP="${PIP[*]}" quietly "the Megatron-Bridge step" bash .ci/install-megatron-bridge.sh
    say "Megatron-Bridge (.ci/install-megatron-bridge.sh $bridge_key): installed without its GPU requirements"
    stamp megatron-bridge "$bridge_key"
fi

if [ "$E2E" = 1 ]; then
    e2e_key="$(sha .ci/install-e2e.sh .ci/install-megatron-bridge.sh pyproject.toml)"
    if [ -x .venv-e2e/bin/python ] && [ -f .venv-e2e/.setup ] && [ "$(cat .venv-e2e/.setup)" = "$e2e_key" ]; then
        say "e2e venv .venv-e2e ($e2e_key): current"
    else
        rm -rf .venv-e2e
        PYTHON="$(command -v "$PYTHON")" quietly "the e2e venv's install (.ci/install-e2e.sh)" bash .ci/install-e2e.sh
        printf '%s' "$e2e_key" >.venv-e2e/.setup
        say "e2e venv .venv-e2e ($e2e_key): installed; run it with .venv-e2e/bin/pytest tests/e2e"
    fi
fi

[ "$TESTS" = 1 ] || exit 0
# Every core: the suite's tests keep their own state (tmp_path, free ports), so pytest-xdist spreads them.
# As an activated venv would be: some tests start the venv's tools (kubectl, docker-compose, hadolint) by name.
export VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH"
say "pytest -n auto --dist worksteal ${PYTEST_ARGS[*]}"
exec pytest -n auto --dist worksteal "${PYTEST_ARGS[@]}"
