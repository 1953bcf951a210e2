"""Hosts simulated on this machine: one Linux network namespace per host of the profile, each
joined to one bridge by a veth pair. The bridge has the subnet's first address, so commands on
this machine reach every host; inside a host there is no default route and no NAT, so no packet
leaves the machine. Creating and removing them needs root (CAP_NET_ADMIN).

A component on a host runs under ``ip netns exec``, which enters the namespace and then execs the
command: the PID is the component's own, and stopping it stops it as on one host.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

from deploy.stack.config import HostConfig, HostsConfig
from deploy.stack.processes import Component

NETNS_DIR = Path("/run/netns")


class NetnsError(RuntimeError):
    """The hosts could not be created or changed; the message says what to do."""


def namespace(hosts: HostsConfig, host: HostConfig) -> str:
    """The host's namespace, and the name of its veth on the bridge (eth0 inside): two stacks
    on one machine keep apart by their bridges' names."""
    return f"{hosts.bridge}-{host.name}"


def exec_prefix(hosts: HostsConfig, host: HostConfig) -> list[str]:
    """What runs a command on ``host``."""
    return [_ip(), "netns", "exec", namespace(hosts, host)]


def exists(hosts: HostsConfig, host: HostConfig) -> bool:
    return (NETNS_DIR / namespace(hosts, host)).exists()


def create(hosts: HostsConfig) -> list[str]:
    """Create the bridge and every host that is missing (idempotent); the hosts created."""
    _check_root()
    prefix = ipaddress.ip_network(hosts.subnet).prefixlen
    if not _link_exists(hosts.bridge):
        _run("link", "add", hosts.bridge, "type", "bridge")
        _run("addr", "add", f"{hosts.bridge_address}/{prefix}", "dev", hosts.bridge)
    _run("link", "set", hosts.bridge, "up")
    made = []
    for host in hosts.hosts:
        if exists(hosts, host):
            continue
        ns = namespace(hosts, host)
        _run("netns", "add", ns)
        _run("link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("link", "set", ns, "master", hosts.bridge, "up")
        _run("-n", ns, "addr", "add", f"{host.address}/{prefix}", "dev", "eth0")
        _run("-n", ns, "link", "set", "eth0", "up")
        _run("-n", ns, "link", "set", "lo", "up")
        made.append(host.name)
    return made


def remove(hosts: HostsConfig) -> list[str]:
    """Remove every host namespace (its veth goes with it) and the bridge; the hosts removed.
    Whatever still runs in a namespace keeps running: stop the components first."""
    if not hosts.enabled:
        return []
    _check_root()
    gone = []
    for host in hosts.hosts:
        if exists(hosts, host):
            _run("netns", "del", namespace(hosts, host))
            gone.append(host.name)
    if _link_exists(hosts.bridge):
        _run("link", "del", hosts.bridge)
    return gone


def set_link(hosts: HostsConfig, host: HostConfig, up: bool) -> None:
    """Cut a host off the others (its veth down) or join it again: a network partition."""
    _check_root()
    _run("link", "set", namespace(hosts, host), "up" if up else "down")


def pids(hosts: HostsConfig, host: HostConfig) -> list[int]:
    """Every process running in the host's namespace."""
    if not exists(hosts, host):
        return []
    out = subprocess.run([_ip(), "netns", "pids", namespace(hosts, host)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _check_root() -> None:
    if os.geteuid() != 0:
        raise NetnsError("a multi-host profile creates network namespaces: run flywheel as root (or use the profile sim)")


def _ip() -> str:
    path = shutil.which("ip")
    if path is None:
        raise NetnsError("`ip` (iproute2) is not installed: apt-get install iproute2")
    return path


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _run(*args: str) -> None:
    out = subprocess.run([_ip(), *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def place(comp: Component, hosts: HostsConfig, host: HostConfig | None) -> Component:
    """``comp`` to run on ``host`` (None: on this machine, as it is)."""
    if host is not None:
        comp.host, comp.address, comp.exec_prefix = host.name, host.address, exec_prefix(hosts, host)
    return comp
