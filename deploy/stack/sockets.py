"""Which TCP sockets a process group listens on, read from /proc (Linux).

The supervisor uses it to tell which registered Dynamo instance is which worker process (an
instance's request-plane address is a port its worker listens on).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from deploy.stack.processes import group_pids

_LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        pass
    return inodes


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6 in /proc is four little-endian 32-bit words
    return str(ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))))


def listening(pids: list[int]) -> list[tuple[str, int, int]]:
    """``(address, port, pid)`` for every TCP socket these processes listen on."""
    out = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except FileNotFoundError:
                continue
            for line in lines:
                cols = line.split()
                if cols[3] != _LISTEN or cols[9] not in inodes:
                    continue
                addr, port = cols[1].split(":")
                out.append((_hex_address(addr), int(port, 16), pid))
    return sorted(set(out))


def group_listening_ports(pgid: int) -> set[int]:
    return {port for _, port, _ in listening(group_pids(pgid))}


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6 (a dual-stack socket bound to it)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def component_listeners(run_dir: Path, names: list[str]) -> list[tuple[str, str, int]]:
    """``(component, address, port)`` for every TCP socket the named components' process
    groups listen on (what `flywheel up` started, and whatever those processes spawned)."""
    from deploy.stack.processes import ProcessManager

    pm, out = ProcessManager(run_dir), []
    for name in names:
        pid = pm.pid(name)
        if pid is not None:
            out += [(name, addr, port) for addr, port, _ in listening(group_pids(pid))]
    return out
