"""What a Dynamo frontend routes to: the instances its discovery lists, read from its ``/health``.

Each instance carries its ``instance_id`` (the worker id its worker's metrics print in hex) and
its request-plane address (``transport.tcp``, ``host:port/...``). The frontend drops an instance
from this list as soon as its discovery entry goes (measured on file discovery: 0.04 s), and
routes only to what it lists.
"""

from __future__ import annotations

import httpx


def routed_instances(frontend_url: str) -> list[dict] | None:
    """The instances the frontend at ``frontend_url`` lists; None if it cannot say (not answering)."""
    try:
        r = httpx.get(f"{frontend_url}/health", timeout=2)
        return list(r.json().get("instances") or [])
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def registered_ports(frontend_url: str) -> set[int] | None:
    """Request-plane ports of the generate instances the frontend can route to (an empty set when
    it lists none); None if it cannot say."""
    instances = routed_instances(frontend_url)
    if instances is None:
        return None
    ports = set()
    for inst in instances:
        host_port = ((inst.get("transport") or {}).get("tcp") or "").split("/", 1)[0]
        if inst.get("endpoint") == "generate" and ":" in host_port:
            ports.add(int(host_port.rsplit(":", 1)[1]))
    return ports


def routes_to(frontend_url: str, worker_id: str) -> bool | None:
    """Whether the frontend still lists worker ``worker_id`` (hex, as the worker's metrics name
    it); None if it cannot say."""
    instances = routed_instances(frontend_url)
    if instances is None:
        return None
    decimal = str(int(worker_id, 16))  # /health prints the id as a decimal number
    return any(str(inst.get("instance_id")) == decimal for inst in instances)
