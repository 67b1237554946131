"""The Kubernetes Pod Security Standards, evaluated on a pod spec: which level does it meet?

The rules are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/
(policy version of Kubernetes 1.37), as Pod Security Admission applies them to a pod's spec.
No maintained Python package evaluates them offline, and the tests need no API server, so
the two levels are written out here, each rule as one function that returns its violations.
Windows-only fields and the AppArmor annotations (gone since 1.30's fields) are covered by
their field forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

LEVELS = ("restricted", "baseline", "privileged")

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})  # fmt: skip
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})  # fmt: skip


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of the pod: init, regular and ephemeral."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _contexts(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, securityContext) for the pod and each container."""
    yield "pod", spec.get("securityContext") or {}
    for container in containers(spec):
        yield f"container {container.get('name')}", container.get("securityContext") or {}


# --- baseline ------------------------------------------------------------------------------


def _host_process(spec: dict[str, Any]) -> list[str]:
    return [f"{where}: hostProcess" for where, ctx in _contexts(spec) if (ctx.get("windowsOptions") or {}).get("hostProcess")]


def _host_namespaces(spec: dict[str, Any]) -> list[str]:
    return [f"pod: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]


def _privileged(spec: dict[str, Any]) -> list[str]:
    return [f"{where}: privileged" for where, ctx in _contexts(spec) if where != "pod" and ctx.get("privileged")]


def _capabilities_baseline(spec: dict[str, Any]) -> list[str]:
    found = []
    for where, ctx in _contexts(spec):
        added = set((ctx.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if where != "pod" and added:
            found.append(f"{where}: adds {sorted(added)}")
    return found


def _host_path(spec: dict[str, Any]) -> list[str]:
    return [f"volume {v.get('name')}: hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]


def _host_ports(spec: dict[str, Any]) -> list[str]:
    return [
        f"container {c.get('name')}: hostPort {p['hostPort']}"
        for c in containers(spec) for p in c.get("ports") or [] if p.get("hostPort")
    ]  # fmt: skip


def _app_armor(spec: dict[str, Any]) -> list[str]:
    return [
        f"{where}: appArmorProfile {ctx['appArmorProfile'].get('type')}"
        for where, ctx in _contexts(spec)
        if ctx.get("appArmorProfile") and ctx["appArmorProfile"].get("type") not in ("RuntimeDefault", "Localhost")
    ]


def _se_linux(spec: dict[str, Any]) -> list[str]:
    found = []
    for where, ctx in _contexts(spec):
        options = ctx.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES or options.get("user") or options.get("role"):
            found.append(f"{where}: seLinuxOptions {options}")
    return found


def _proc_mount(spec: dict[str, Any]) -> list[str]:
    return [f"{where}: procMount {ctx['procMount']}" for where, ctx in _contexts(spec) if ctx.get("procMount", "Default") != "Default"]


def _seccomp_baseline(spec: dict[str, Any]) -> list[str]:
    return [
        f"{where}: seccomp Unconfined" for where, ctx in _contexts(spec) if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined"
    ]


def _sysctls(spec: dict[str, Any]) -> list[str]:
    sysctls = (spec.get("securityContext") or {}).get("sysctls") or []
    return [f"pod: sysctl {s.get('name')}" for s in sysctls if s.get("name") not in SAFE_SYSCTLS]


# --- restricted ----------------------------------------------------------------------------


def _volume_types(spec: dict[str, Any]) -> list[str]:
    found = []
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume.get('name')}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    return found


def _privilege_escalation(spec: dict[str, Any]) -> list[str]:
    return [
        f"container {c.get('name')}: allowPrivilegeEscalation not false"
        for c in containers(spec) if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]  # fmt: skip


def _non_root(spec: dict[str, Any]) -> list[str]:
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    found = []
    for container in containers(spec):
        own = (container.get("securityContext") or {}).get("runAsNonRoot")
        if own is False or (own is None and pod is not True):
            found.append(f"container {container.get('name')}: runAsNonRoot not true")
    return found


def _non_root_user(spec: dict[str, Any]) -> list[str]:
    return [f"{where}: runAsUser 0" for where, ctx in _contexts(spec) if ctx.get("runAsUser") == 0]


def _seccomp_restricted(spec: dict[str, Any]) -> list[str]:
    def allowed(ctx: dict[str, Any]) -> bool | None:
        kind = (ctx.get("seccompProfile") or {}).get("type")
        return None if kind is None else kind in ("RuntimeDefault", "Localhost")

    pod = allowed(spec.get("securityContext") or {})
    found = [] if pod is not False else ["pod: seccomp not RuntimeDefault/Localhost"]
    for container in containers(spec):
        own = allowed(container.get("securityContext") or {})
        if own is False or (own is None and pod is not True):
            found.append(f"container {container.get('name')}: seccomp not RuntimeDefault/Localhost")
    return found


def _capabilities_restricted(spec: dict[str, Any]) -> list[str]:
    found = []
    for container in containers(spec):
        capabilities = (container.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"container {container.get('name')}: does not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"container {container.get('name')}: adds {capabilities['add']}")
    return found


Rule = Callable[[dict[str, Any]], list[str]]
BASELINE: tuple[Rule, ...] = (
    _host_process, _host_namespaces, _privileged, _capabilities_baseline, _host_path, _host_ports,
    _app_armor, _se_linux, _proc_mount, _seccomp_baseline, _sysctls,
)  # fmt: skip
RESTRICTED: tuple[Rule, ...] = BASELINE + (
    _volume_types, _privilege_escalation, _non_root, _non_root_user, _seccomp_restricted, _capabilities_restricted,
)  # fmt: skip


def violations(spec: dict[str, Any], level: str) -> list[str]:
    """What in the pod spec breaks LEVEL (baseline or restricted); empty when it meets it."""
    rules = {"baseline": BASELINE, "restricted": RESTRICTED, "privileged": ()}[level]
    return [found for rule in rules for found in rule(spec)]


def level_met(spec: dict[str, Any]) -> str:
    """The strictest Pod Security level the pod spec meets."""
    return next(level for level in LEVELS if not violations(spec, level))
