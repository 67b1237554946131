"""recipe.cluster.rules: the roles and the rules `plan` checks (hosts, GCS addresses, several nodes, Ray auth).

Each rule is a table of hand-written inputs -> the exact lines a user sees: `plan` prints them as
`error: ...` lines and users grep logs for them, so a changed word is a regression. The roles are
compared whole (kind, address, rank, node count and the reason `run` logs), and one property
proves the address a worker is told is one the join path accepts and splits back.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from recipe.cluster import rules

# The rule texts, written out once so the tables stay readable; each is pinned exactly.
RFC = ("must be an IP address or a host name (RFC 1123: dot-separated labels of 1-63 letters, "
       "digits or hyphens, not starting or ending with a hyphen)")
IPV4 = "must be a valid IPv4 address (a host name cannot end in an all-numeric label)"
IN_BRACKETS = "must be an IPv6 address inside the brackets"
NO_PORT = "must be a host name or IP address without a port (the port is RAY_PORT)"
GCS = "must be a GCS address host:port"
GCS_SCHEME = ("must be a GCS address host:port (a dashboard http:// or a Ray Client ray:// address "
              "is not one the trainer can join)")
GCS_AUTO = ("must be a GCS address host:port: `auto` names no head the recipe can probe and count "
            "nodes on (KubeRay sets host:port)")
GCS_PORT = "must be a GCS address host:port with a TCP port in [1, 65535]"
GCS_IPV6 = "must be a GCS address host:port, with an IPv6 host in brackets ([::1]:6379)"
PORT_RULE = "must be a TCP port in [1, 65535]"

# RFC 1123 caps a host name at 253 characters (labels of at most 63): 63+1+63+1+63+1+61.
LONGEST_NAME = ".".join(["a" * 63] * 3 + ["a" * 61])
assert len(LONGEST_NAME) == 253


# --- the role each node plays ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nnodes", "rank", "master", "port", "ray_address", "role"),
    [
        (1, 0, None, 6379, None,
         rules.RayRole("single", None, 0, 1, "NNODES=1: the trainer starts its own local Ray")),
        (2, 0, "head.local", 6380, None,
         rules.RayRole("head", "head.local:6380", 0, 2, "NNODES=2, NODE_RANK=0: start the Ray head on port 6380")),
        (4, 3, "10.0.0.1", 6379, None,
         rules.RayRole("worker", "10.0.0.1:6379", 3, 4, "NNODES=4, NODE_RANK=3: join the head at 10.0.0.1:6379")),
        # An IPv6 head is bracketed, else host:port would be ambiguous; a bracketed one is kept as is.
        (2, 1, "fe80::1", 6379, None,
         rules.RayRole("worker", "[fe80::1]:6379", 1, 2, "NNODES=2, NODE_RANK=1: join the head at [fe80::1]:6379")),
        (2, 0, "[fe80::1]", 6379, None,
         rules.RayRole("head", "[fe80::1]:6379", 0, 2, "NNODES=2, NODE_RANK=0: start the Ray head on port 6379")),
        # KubeRay: the cluster exists; MASTER_ADDR does not matter, NODE_RANK is only carried along.
        (4, 2, None, 6379, "10.0.0.9:6379",
         rules.RayRole("join-existing", "10.0.0.9:6379", 2, 4, "RAY_ADDRESS=10.0.0.9:6379 is set: join that cluster")),
        (1, 0, None, 6379, "10.0.0.9:6379",
         rules.RayRole("join-existing", "10.0.0.9:6379", 0, 1, "RAY_ADDRESS=10.0.0.9:6379 is set: join that cluster")),
    ],
)
def test_each_node_gets_its_role_address_and_logged_reason(
    nnodes: int, rank: int, master: str | None, port: int, ray_address: str | None, role: rules.RayRole
) -> None:
    planned = rules.plan_ray_role(nnodes, rank, master, port, ray_address)
    assert planned == role
    assert planned.runs_trainer is (role.kind != "worker")
    assert planned.starts_ray is (role.kind in ("head", "worker"))


def test_head_without_master_addr_is_refused_too() -> None:
    # A head that guessed its own address could not be joined by workers never told it.
    with pytest.raises(rules.ClusterError) as caught:
        rules.plan_ray_role(2, 0, None, 6380, None)
    assert caught.value.problems == [
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=0 (or RAY_ADDRESS a running cluster)"
    ]


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(rules.ClusterError) as caught:
        rules.plan_ray_role(2, 2, None, 70000, None)
    assert caught.value.problems == [
        "NODE_RANK=2: must be in [0, NNODES=2)",
        "RAY_PORT=70000: must be a TCP port in [1, 65535]",
        "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=2 (or RAY_ADDRESS a running cluster)",
    ]


def test_a_cluster_error_reads_as_its_problems_joined() -> None:
    # What a traceback or a log line shows when the error is not printed line by line by the CLI.
    error = rules.ClusterError(["NNODES=0: must be at least 1", "RAY_PORT=0: must be a TCP port in [1, 65535]"])
    assert str(error) == "NNODES=0: must be at least 1; RAY_PORT=0: must be a TCP port in [1, 65535]"


_host_names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9](\.[a-z][a-z0-9-]{0,8}[a-z0-9]){0,3}", fullmatch=True)
_masters = st.one_of(
    _host_names,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)


@settings(max_examples=150)
@given(master=_masters, port=st.integers(1, 65535), rank=st.integers(0, 7))
def test_the_address_a_node_is_told_is_one_the_join_path_accepts(master: str, port: int, rank: int) -> None:
    # The head advertises and the workers join exactly this address; the join path checks it with
    # gcs_address_problem and probes it with split_address's (host, port).
    role = rules.plan_ray_role(8, rank, master, port, None)
    assert role.address is not None
    assert rules.gcs_address_problem(role.address) is None
    assert rules.split_address(role.address) == (master.strip("[]"), port)



@given(address=st.ip_addresses())
def test_brackets_hold_an_ipv6_address_and_nothing_else(address: object) -> None:
    """Every IPv6 address is accepted in brackets and every IPv4 one refused there; both bare."""
    bracketed = rules.host_problem(f"[{address}]")
    assert bracketed == (None if ":" in str(address) else IN_BRACKETS)
    assert rules.host_problem(str(address)) is None

# --- hosts (MASTER_ADDR, and the host of a GCS address) -------------------------------------------


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("10.0.0.1", None),
        ("head.local", None),
        ("node-1", None),
        ("head.local.", None),  # a fully qualified name may end in the root's dot
        ("a" * 63, None),
        (LONGEST_NAME, None),
        ("fe80::1", None),
        ("[fe80::1]", None),
        ("[::1]", None),
        # Brackets hold an IPv6 address, nothing else.
        ("[head]", IN_BRACKETS),
        ("[10.0.0.1:1]", IN_BRACKETS),
        ("[10.0.0.1]", IN_BRACKETS),  # an IPv4 address goes without brackets
        ("[::1", RFC),  # an unclosed bracket is no bracket: a host name with a bad character
        ("head:6379", NO_PORT),
        ("10.0.0.1:6379", NO_PORT),
        ("head:", NO_PORT),
        ("a b", RFC),
        ("-h", RFC),
        ("h-", RFC),
        ("x-.", RFC),  # the root's dot is dropped, the label before it still ends in a hyphen
        ("h_", RFC),
        ("a_b.", RFC),
        ("h..x", RFC),
        ("10.0.0.1/24", RFC),
        ("x" * 64, RFC),
        (LONGEST_NAME + "a", RFC),  # 254 characters
        ("999.1.1.1", IPV4),
        ("10.0.0.256", IPV4),
        ("a.1.", IPV4),
    ],
)
def test_a_host_is_an_ip_address_or_an_rfc_1123_name(host: str, problem: str | None) -> None:
    assert rules.host_problem(host) == problem


# --- RAY_ADDRESS: a GCS address host:port -----------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("10.0.0.9:6379", None),
        ("head-svc.ns.svc.cluster.local:6379", None),
        ("[::1]:6379", None),
        ("[fe80::1]:6380", None),
        ("localhost:1", None),
        ("h:65535", None),
        ("http://head:8265", GCS_SCHEME),
        ("ray://head:10001", GCS_SCHEME),
        ("auto", GCS_AUTO),
        ("head", GCS),
        (":6379", GCS),
        ("head:0", GCS_PORT),
        ("head:65536", GCS_PORT),
        ("head:", GCS_PORT),
        ("head:port", GCS_PORT),
        ("head:-1", GCS_PORT),
        ("head:\u0666\u0663\u0667\u0669", GCS_PORT),  # Arabic-Indic digits: int() reads them, a socket does not
        ("::1:6379", GCS_IPV6),
        ("fe80::1:6379", GCS_IPV6),
        ("-head:6379", f"{GCS}; its host {RFC}"),
        ("he_ad:6379", f"{GCS}; its host {RFC}"),
        ("999.1.1.1:6379", f"{GCS}; its host {IPV4}"),
        ("[head]:6379", f"{GCS}; its host {IN_BRACKETS}"),
    ],
)
def test_a_ray_address_must_be_a_gcs_host_port(address: str, problem: str | None) -> None:
    assert rules.gcs_address_problem(address) == problem


# --- the cluster variables together -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("nnodes", "rank", "master", "port", "ray_address", "problems"),
    [
        (1, 0, None, 6379, None, []),
        (2, 1, "h", 6379, None, []),
        (1, 0, None, 1, None, []),
        (1, 0, None, 65535, None, []),
        # RAY_ADDRESS names the cluster: no MASTER_ADDR is needed.
        (4, 0, None, 6379, "10.0.0.9:6379", []),
        (0, 0, None, 6379, None, ["NNODES=0: must be at least 1"]),
        (1, 1, None, 6379, None, ["NODE_RANK=1: must be in [0, NNODES=1)"]),
        (2, -1, "h", 6379, None, ["NODE_RANK=-1: must be in [0, NNODES=2)"]),
        (1, 0, None, 0, None, [f"RAY_PORT=0: {PORT_RULE}"]),
        (1, 0, None, 65536, None, [f"RAY_PORT=65536: {PORT_RULE}"]),
        (2, 1, None, 6379, None, [
            "MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES=2 and NODE_RANK=1 (or RAY_ADDRESS a running cluster)"
        ]),
        (2, 1, "head:6379", 6379, None, [f"MASTER_ADDR=head:6379: {NO_PORT}"]),
        (2, 1, "-h", 6379, None, [f"MASTER_ADDR=-h: {RFC}"]),
        (1, 0, None, 6379, "http://head:8265", [
            ("RAY_ADDRESS=http://head:8265: must be a GCS address host:port "
             "(a dashboard http:// address is for `ray job submit`, not for the trainer)")
        ]),
        (1, 0, None, 6379, "auto", [f"RAY_ADDRESS=auto: {GCS_AUTO}"]),
        (1, 0, None, 6379, "head:0", [f"RAY_ADDRESS=head:0: {GCS_PORT}"]),
        # Every bad variable at once, in the order the variables are documented.
        (0, -1, "-h", 0, "auto", [
            "NNODES=0: must be at least 1",
            "NODE_RANK=-1: must be in [0, NNODES=0)",
            f"RAY_PORT=0: {PORT_RULE}",
            f"MASTER_ADDR=-h: {RFC}",
            f"RAY_ADDRESS=auto: {GCS_AUTO}",
        ]),
    ],
)
def test_cluster_variables_are_checked_with_one_line_each(
    nnodes: int, rank: int, master: str | None, port: int, ray_address: str | None, problems: list[str]
) -> None:
    assert rules.cluster_problems(nnodes, rank, master, port, ray_address) == problems


# --- Ray's authentication ---------------------------------------------------------------------------

TOKEN_MISSING = "RAY_AUTH_TOKEN=: must be set (the same on every node) when RAY_AUTH_MODE=token"


@pytest.mark.parametrize(
    ("nnodes", "ray_address", "mode", "token_set", "problems"),
    [
        (3, None, None, False, [
            ("RAY_AUTH_MODE=: must be token when NNODES=3 starts Ray across machines, with the same "
             "RAY_AUTH_TOKEN on every node (e.g. `openssl rand -hex 32`); RAY_AUTH_MODE=disabled only on an "
             "isolated network"),
            TOKEN_MISSING,  # in the same round: setting the mode alone would only bring this line next time
        ]),
        (3, None, None, True, [
            ("RAY_AUTH_MODE=: must be token when NNODES=3 starts Ray across machines, with the same "
             "RAY_AUTH_TOKEN on every node (e.g. `openssl rand -hex 32`); RAY_AUTH_MODE=disabled only on an "
             "isolated network")
        ]),
        (2, None, "token", False, [TOKEN_MISSING]),
        (1, None, "token", False, [TOKEN_MISSING]),
        (2, None, "token", True, []),
        (2, None, "disabled", False, []),
        (1, None, None, False, []),  # one node: Ray's ports stay on this machine
        (4, "10.0.0.9:6379", None, False, []),  # KubeRay's cluster made its own token
    ],
)
def test_ray_auth_is_required_across_machines(
    nnodes: int, ray_address: str | None, mode: str | None, token_set: bool, problems: list[str]
) -> None:
    assert rules.ray_auth_problems(nnodes, ray_address, mode, token_set) == problems


# --- splitting an address for the TCP probe -----------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "parts"),
    [
        ("h:1", ("h", 1)),
        ("[::1]:6379", ("::1", 6379)),
        ("XE9680-01:6379", ("XE9680-01", 6379)),  # only brackets are stripped from the host
    ],
)
def test_split_address(address: str, parts: tuple[str, int]) -> None:
    assert rules.split_address(address) == parts


@pytest.mark.parametrize("bad", ["h", "h:", ":1", "h:x"])
def test_split_address_refuses_what_is_not_host_port(bad: str) -> None:
    with pytest.raises(rules.ClusterError) as caught:
        rules.split_address(bad)
    assert caught.value.problems == [f"address {bad!r}: must be host:port"]


# --- a URL where a bare host belongs ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "ray", "tcp"]),
    host=st.one_of(st.ip_addresses(v=4).map(str), st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9](\.[a-z]{2,8}){0,2}", fullmatch=True)),
    port=st.one_of(st.none(), st.integers(1, 65535)),
)
def test_a_url_names_what_to_drop_and_what_is_left_works(scheme: str, host: str, port: int | None) -> None:
    """`MASTER_ADDR=http://10.0.0.1:6379`: the line says to drop the scheme (and the port, which is RAY_PORT's), and
    the host it leaves is one the rule takes, so the advice works when followed literally."""
    url = f"{scheme}://{host}" + (f":{port}" if port is not None else "")
    problem = rules.host_problem(url)
    assert problem is not None and problem.startswith(f"must be a bare host, not a URL: drop {scheme}://")
    assert ("the port is RAY_PORT" in problem) is (port is not None)
    assert problem.endswith(f"leaving {host!r}") and rules.host_problem(host) is None


# --- RAY_START_ARGS: this node's extra `ray start` flags ------------------------------------------------------------

#: Flags as `--flag=value` (a value as a word of its own is in the named cases below).
_FLAGS = ["--node-ip-address=10.0.0.5", "--object-store-memory=100000000",
          "--temp-dir=/tmp/r", "--dashboard-agent-listen-port=52366", "--include-dashboard=false", "--num-cpus=8"]


@given(words=st.lists(st.sampled_from([*_FLAGS, *rules.OWN_RAY_START_FLAGS, "--port=1", "--labels=a=b", "x"]),
                      max_size=5))
@example(words=["--head"])
@example(words=["--address=10.0.0.1:6379"])
@example(words=["x", "--num-cpus=8"])  # a word before any flag
@example(words=["--node-ip-address=10.0.0.5", "--num-cpus=8"])  # the control: accepted
def test_ray_start_args_refuse_the_recipes_own_flags_and_stray_words(words: list[str]) -> None:
    text = shlex.join(words)
    problem = rules.ray_start_args_problem(text)
    own = any(word.partition("=")[0] in rules.OWN_RAY_START_FLAGS for word in words)
    stray = bool(words) and not words[0].startswith("--")
    assert (problem is not None) == (own or stray), (words, problem)
    if own and not stray:
        assert "the recipe sets it from NODE_RANK, MASTER_ADDR and RAY_PORT" in problem  # type: ignore[operator]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("--node-ip-address='10.0.0.5", "must be `ray start` flags quoted as in a shell (No closing quotation)"),
        ("--node-ip-address=http://10.0.0.5", "--node-ip-address must be a bare host, not a URL: drop http://, "
                                              "leaving '10.0.0.5'"),
        ("--node-ip-address=10.0.0.5:6379", "--node-ip-address must be a host name or IP address without a port "
                                            "(the port is RAY_PORT)"),
        ("--node-ip-address 10.0.0.5", None),
        ("", None),
    ],
)
def test_ray_start_args_name_what_is_wrong(text: str, problem: str | None) -> None:
    assert rules.ray_start_args_problem(text) == problem


@pytest.mark.parametrize(
    ("text", "address", "extra"),
    [
        ("--node-ip-address=10.0.0.5 --num-cpus=8", "10.0.0.5", ("--num-cpus=8",)),
        ("--num-cpus=8 --node-ip-address 10.0.0.6 --temp-dir=/t", "10.0.0.6", ("--num-cpus=8", "--temp-dir=/t")),
        ("--temp-dir='/a b'", None, ("--temp-dir=/a b",)),
        (None, None, ()),
    ],
)
def test_the_node_options_of_ray_start_args_give_each_flag_once(text: str | None, address: str | None,
                                                                 extra: tuple[str, ...]) -> None:
    from recipe.cluster.ray_node import node_options, ray_start_argv

    options = node_options(text)
    assert (options.node_ip_address, options.extra_args) == (address, extra)
    argv = ray_start_argv(node_rank=1, options=options, address="10.0.0.1:6379")
    assert sum(word.startswith("--node-ip-address") for word in argv) == (address is not None)
    assert argv[len(argv) - len(extra):] == list(extra)


def test_a_refused_ray_start_args_is_one_line_naming_the_setting_and_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from recipe.errors import RecipeConfigError
    from recipe.settings import load_settings

    monkeypatch.setenv("RAY_START_ARGS", "--num-cpus=8 --port=1")
    with pytest.raises(RecipeConfigError) as refused:
        load_settings()
    assert refused.value.problems == [
        "RAY_START_ARGS='--num-cpus=8 --port=1': must not set --port: the recipe sets it from NODE_RANK, MASTER_ADDR "
        "and RAY_PORT (--head, --address, --port, --block, --labels are its own)"
    ]


def test_the_failure_bounds_of_nodes_started_by_run_and_of_a_rayjobs_driver() -> None:
    """One node: nothing to say. Nodes started by `run`: both bounds, the worker's with RAY_WAIT_TIMEOUT. A RayJob's
    driver (RAY_ADDRESS): the lost node's bound only, and the RayJob's retry as the restart."""
    assert rules.failure_bounds(1, 60) == {} and rules.failure_bounds(1, 60, joins_cluster=True) == {}
    nodes = rules.failure_bounds(2, 60)
    assert (nodes["lost_node_bound_s"], nodes["lost_head_bound_s"]) == (100.0, 15 + 30.0 + 60)
    assert nodes["text"] == (
        "a node lost mid-run ends the head's run within 100 s, a lost head each worker's within 105 s "
        "(RAY_WAIT_TIMEOUT=60 s for a restarted head among it): exit 3 and one line naming it; a restart of every node "
        "resumes from the last save"
    )
    driver = rules.failure_bounds(2, 60, joins_cluster=True)
    assert driver == {
        "lost_node_bound_s": 100.0,
        "text": "a node lost mid-run ends this run within 100 s: exit 3 and one line naming it; a lost head ends it "
                "with the head; the RayJob's retry (its backoffLimit) resumes from the last save",
    }  # fmt: skip


@pytest.mark.parametrize(("words", "address"), [
    (["--node-ip-address", "10.0.0.5"], "10.0.0.5"),  # the flag's value as the last word
    (["--num-cpus=8", "--node-ip-address"], None),  # the flag as the last word: no value
    (["--node-ip-address=10.0.0.5=x"], "10.0.0.5=x"),  # the value after the first "=", whatever it holds
    (["--node-ip-address", "10.0.0.5", "--num-cpus=8"], "10.0.0.5"),
    ([], None),
])  # fmt: skip
def test_node_ip_address_of_ray_start_words(words: list[str], address: str | None) -> None:
    assert rules.node_ip_address(words) == address


def test_a_url_with_a_capital_scheme_is_named_a_url() -> None:
    assert rules.host_problem("HTTP://head:6379") == (
        "must be a bare host, not a URL: drop HTTP:// and the port; the port is RAY_PORT (here 6379), leaving 'head'"
    )
