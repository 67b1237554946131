"""The rules `plan` checks before any Ray process exists: hosts, the GCS address, Ray auth, each node's role.

Pure functions of the settings' values; nothing here starts, connects to or imports Ray.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


RoleKind = Literal["single", "head", "worker", "join-existing"]
ResourceName = Literal["GPU", "NPU"]

#: Node label that carries NODE_RANK, so a failed wait can name the ranks missing.
NODE_RANK_LABEL = "grpo-recipe/node-rank"

# --- how long a lost node or a lost head takes to end the run (docs/deploy.md, "A lost node") ------------------
#: How long Ray 2.60's GCS takes at most to mark a lost node dead with its default health checks: one every 3 s
#: (health_check_period_ms), dead after 5 failures (health_check_failure_threshold), each failing at once for a
#: killed node (about 15 s, measured) or after its 10 s timeout (health_check_timeout_ms) for one cut off.
HEALTH_CHECKS_S = 5 * (3.0 + 10.0)
#: How often the head's `run` reads Ray's node table while the trainer runs (recipe.cluster.node_watch).
NODE_CHECK_INTERVAL_S = 5.0
#: How long the trainer has to end on its own once asked to stop, before its process group is killed.
TRAINER_STOP_GRACE_S = 30.0
#: How long a worker's raylet waits for a head whose GCS is gone before it ends (Ray's default, 60 s). The recipe
#: runs no GCS fault tolerance, so a lost GCS never comes back: a restarted head is a new cluster, which the
#: worker's `run` joins anew (recipe.cluster.supervisors.run_worker). Waiting longer only delays that, and the
#: worker's end when the head is gone for good. A value in the node's environment wins.
GCS_RECONNECT_VARIABLE = "RAY_gcs_rpc_server_reconnect_timeout_s"
GCS_RECONNECT_TIMEOUT_S = 15
#: The most `ray start --block` takes to end once its raylet ended (recipe.cluster.ray_node.RayNode.stop's grace).
RAY_STOP_S = 30.0


def lost_node_bound_s() -> float:
    """From a node's loss to the end of the head's `run` (exit 3): Ray's health checks, one read of the node table,
    the trainer's grace to stop. No collective timeout (NCCL's, HCCL's, gloo's, verl's nccl_timeout) is waited for."""
    return HEALTH_CHECKS_S + NODE_CHECK_INTERVAL_S + TRAINER_STOP_GRACE_S


def lost_head_bound_s(rejoin_grace_s: float) -> float:
    """From the head's loss to the end of a worker's `run` (exit 3): its raylet's wait for the GCS, its `ray start`
    ending, then its wait for a restarted head (RAY_WAIT_TIMEOUT, `rejoin_grace_s`)."""
    return GCS_RECONNECT_TIMEOUT_S + RAY_STOP_S + rejoin_grace_s


def failure_bounds(nnodes: int, rejoin_grace_s: float, joins_cluster: bool = False) -> dict[str, object]:
    """What a lost node does to a run across `nnodes` nodes, for `plan` to state; empty on one node.

    `joins_cluster`: RAY_ADDRESS is set (KubeRay's RayJob), so `run` is the driver only: the raylets are KubeRay's,
    a lost head takes the driver with it, and the RayJob's retry is the restart (no worker `run` waits for one)."""
    if nnodes < 2:
        return {}
    node, head = lost_node_bound_s(), lost_head_bound_s(rejoin_grace_s)
    if joins_cluster:
        return {
            "lost_node_bound_s": node,
            "text": f"a node lost mid-run ends this run within {node:.0f} s: exit 3 and one line naming it; a lost "
                    "head ends it with the head; the RayJob's retry (its backoffLimit) resumes from the last save",
        }  # fmt: skip
    return {
        "lost_node_bound_s": node,
        "lost_head_bound_s": head,
        "text": f"a node lost mid-run ends the head's run within {node:.0f} s, a lost head each worker's within "
                f"{head:.0f} s (RAY_WAIT_TIMEOUT={rejoin_grace_s:.0f} s for a restarted head among it): exit 3 and "
                "one line naming it; a restart of every node resumes from the last save",
    }  # fmt: skip


class ClusterError(RuntimeError):
    """The Ray cluster could not be formed or joined.

    ``problems`` holds one line per problem, in the house form
    ``NAME=value: rule``, so the CLI can print them like config errors.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: list[str] = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class RayRole:
    """What this node does with Ray, decided from the environment once."""

    kind: RoleKind
    #: GCS address ``host:port``: the one the head serves and workers join
    #: (MASTER_ADDR:RAY_PORT), or RAY_ADDRESS for ``join-existing``; None for ``single``.
    address: str | None
    node_rank: int
    nnodes: int
    reason: str

    @property
    def starts_ray(self) -> bool:
        """True when this node starts a Ray process of its own (head or worker)."""
        return self.kind in ("head", "worker")

    @property
    def runs_trainer(self) -> bool:
        """True when the trainer runs on this node (every role but ``worker``)."""
        return self.kind != "worker"


#: One label of a host name (RFC 1123): letters, digits and hyphens, 1 to 63, no hyphen at either end.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def host_problem(host: str) -> str | None:
    """Why `host` is not an IP address or an RFC 1123 host name (None when it is one).

    An IPv6 address may come in brackets. A port does not belong here (RAY_PORT has it).
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        address = None
    if bare != host:  # brackets are for IPv6 alone (RFC 3986 host syntax)
        return None if isinstance(address, ipaddress.IPv6Address) else "must be an IPv6 address inside the brackets"
    if address is not None:
        return None
    url = re.fullmatch(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/:]*)(?::(\d*))?/?", host)
    if url:
        port = f" and the port; the port is RAY_PORT (here {url.group(3)})" if url.group(3) else ""
        return f"must be a bare host, not a URL: drop {url.group(1)}://{port}, leaving {url.group(2)!r}"
    if re.fullmatch(r"[^:]+:\d*", host):
        return "must be a host name or IP address without a port (the port is RAY_PORT)"
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        return ("must be an IP address or a host name (RFC 1123: dot-separated labels of 1-63 letters, "
                "digits or hyphens, not starting or ending with a hyphen)")
    if labels[-1].isdigit():
        return "must be a valid IPv4 address (a host name cannot end in an all-numeric label)"
    return None


def gcs_address_problem(address: str) -> str | None:
    """Why `address` is not a Ray GCS address this module can join (None when it is).

    The join-existing path probes the head over TCP and counts its nodes before the
    trainer starts (split_address, head_reachable, wait_for_nodes), so it needs an
    explicit ``host:port``. Ray's own ``auto`` (look for a cluster started on this
    machine) and ``ray://`` (Ray Client) name nothing to probe; KubeRay sets host:port.
    """
    if "://" in address:
        return ("must be a GCS address host:port (a dashboard http:// or a Ray Client ray:// address "
                "is not one the trainer can join)")
    if address == "auto":
        return ("must be a GCS address host:port: `auto` names no head the recipe can probe and count "
                "nodes on (KubeRay sets host:port)")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return "must be a GCS address host:port"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return "must be a GCS address host:port with a TCP port in [1, 65535]"
    if ":" in host and not host.startswith("["):
        return "must be a GCS address host:port, with an IPv6 host in brackets ([::1]:6379)"
    problem = host_problem(host)
    return None if problem is None else f"must be a GCS address host:port; its host {problem}"


#: `ray start` flags the recipe sets itself on every node (recipe.cluster.ray_node.ray_start_argv): RAY_START_ARGS
#: may not set them, since a second value would start another node than the plan's.
OWN_RAY_START_FLAGS = ("--head", "--address", "--port", "--block", "--labels")


def ray_start_args_problem(text: str) -> str | None:
    """Why `text` (RAY_START_ARGS) is not extra `ray start` flags for this node, or None.

    Shell words, each a `--flag` or `--flag=value` (a value as a word of its own is taken as given to the flag
    before it, as click reads it); none of the flags the recipe sets itself; `--node-ip-address` a host.
    """
    try:
        words = shlex.split(text)
    except ValueError as error:
        return f"must be `ray start` flags quoted as in a shell ({error})"
    if words and not words[0].startswith("--"):
        return f"must be `ray start` flags, each starting with `--` (the first word is {words[0]!r})"
    for word in words:
        flag = word.partition("=")[0]
        if flag in OWN_RAY_START_FLAGS:
            return (f"must not set {flag}: the recipe sets it from NODE_RANK, MASTER_ADDR and RAY_PORT "
                    f"({', '.join(OWN_RAY_START_FLAGS)} are its own)")
    address = node_ip_address(words)
    problem = None if address is None else host_problem(address)
    return None if problem is None else f"--node-ip-address {problem}"


def node_ip_address(words: list[str]) -> str | None:
    """The value of `--node-ip-address` among `ray start` words (`--flag=value` or `--flag value`), or None."""
    for index, word in enumerate(words):
        if word.startswith("--node-ip-address="):
            return word.partition("=")[2]
        if word == "--node-ip-address" and index + 1 < len(words):
            return words[index + 1]
    return None


def cluster_problems(
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    ray_port: int,
    ray_address_env: str | None = None,
) -> list[str]:
    """Every problem with the cluster variables, one line each (empty when fine).

    Pure; meant for the settings validator so these join the other config errors.
    """
    problems: list[str] = []
    if nnodes < 1:
        problems.append(f"NNODES={nnodes}: must be at least 1")
    if node_rank < 0 or (nnodes >= 1 and node_rank >= nnodes):
        problems.append(f"NODE_RANK={node_rank}: must be in [0, NNODES={nnodes})")
    if not 1 <= ray_port <= 65535:
        problems.append(f"RAY_PORT={ray_port}: must be a TCP port in [1, 65535]")
    if master_addr and host_problem(master_addr):
        problems.append(f"MASTER_ADDR={master_addr}: {host_problem(master_addr)}")
    if ray_address_env:
        if "://" in ray_address_env:
            problems.append(
                f"RAY_ADDRESS={ray_address_env}: must be a GCS address host:port "
                "(a dashboard http:// address is for `ray job submit`, not for the trainer)"
            )
        elif gcs_address_problem(ray_address_env):
            problems.append(f"RAY_ADDRESS={ray_address_env}: {gcs_address_problem(ray_address_env)}")
    elif nnodes > 1 and not master_addr:
        # Rank 0 too: its head advertises this address, and a head that guessed its own
        # (the host name) could not be joined by workers that were never told it.
        problems.append(
            f"MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES={nnodes} and NODE_RANK={node_rank}"
            " (or RAY_ADDRESS a running cluster)"
        )
    return problems


def ray_auth_problems(
    nnodes: int, ray_address_env: str | None, ray_auth_mode: str | None, ray_auth_token_set: bool
) -> list[str]:
    """Problems with Ray's authentication for the cluster this node would form (empty when fine).

    Ray on the host network runs any job from anyone who reaches its ports. A cluster this
    recipe starts across machines (not KubeRay's, which makes its own token: RAY_ADDRESS set)
    therefore needs Ray's token authentication unless the user turned it off by name. Only
    whether the token is set reaches this function, never its value.
    """
    if ray_address_env:
        return []
    problems = []
    if nnodes > 1 and ray_auth_mode is None:
        problems.append(
            f"RAY_AUTH_MODE=: must be token when NNODES={nnodes} starts Ray across machines, with the same "
            "RAY_AUTH_TOKEN on every node (e.g. `openssl rand -hex 32`); RAY_AUTH_MODE=disabled only on an "
            "isolated network"
        )
    # An unset mode must become token: the token it then needs is asked for in the same round, not the next.
    needs_token = ray_auth_mode == "token" or (nnodes > 1 and ray_auth_mode is None)
    if needs_token and not ray_auth_token_set:
        problems.append("RAY_AUTH_TOKEN=: must be set (the same on every node) when RAY_AUTH_MODE=token")
    return problems


def plan_ray_role(
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    ray_port: int,
    ray_address_env: str | None,
) -> RayRole:
    """Decide this node's Ray role; raise ClusterError listing every bad variable.

    RAY_ADDRESS wins over NNODES/NODE_RANK: under KubeRay the cluster exists already.
    """
    problems = cluster_problems(nnodes, node_rank, master_addr, ray_port, ray_address_env)
    if problems:
        raise ClusterError(problems)
    if ray_address_env:
        return RayRole("join-existing", ray_address_env, node_rank, nnodes,
                       f"RAY_ADDRESS={ray_address_env} is set: join that cluster")
    if nnodes == 1:
        return RayRole("single", None, 0, 1, "NNODES=1: the trainer starts its own local Ray")
    if not master_addr:  # cluster_problems refused it above; kept for the type checker
        raise ClusterError([f"MASTER_ADDR=: must name the NODE_RANK=0 host when NNODES={nnodes}"])
    head_host = master_addr
    if ":" in head_host and not head_host.startswith("["):
        head_host = f"[{head_host}]"  # an IPv6 address: host:port would be ambiguous
    address = f"{head_host}:{ray_port}"
    if node_rank == 0:
        return RayRole("head", address, 0, nnodes,
                       f"NNODES={nnodes}, NODE_RANK=0: start the Ray head on port {ray_port}")
    return RayRole("worker", address, node_rank, nnodes,
                   f"NNODES={nnodes}, NODE_RANK={node_rank}: join the head at {address}")




def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); brackets around an IPv6 host are removed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError([f"address {address!r}: must be host:port"])
    return host.strip("[]"), int(port)
