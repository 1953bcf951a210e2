"""etcd for a multi-host profile: Dynamo's discovery store (a 30 s lease per process, renewed
by it: measured with etcd's /v3/lease/timetolive), one member on the control host, started and
stopped by PID like Redis. Debian's ``etcd-server`` package (scripts/bootstrap.sh installs it)."""

from __future__ import annotations

import shutil

from deploy.stack.config import StackConfig
from deploy.stack.netns import place
from deploy.stack.processes import Component


def etcd_component(cfg: StackConfig) -> Component:
    hosts = cfg.hosts
    at, port = hosts.control.address, hosts.etcd_port
    client, peer = f"http://{at}:{port}", f"http://{at}:{port + 1}"
    argv = [
        shutil.which("etcd") or "etcd",
        "--name",
        "flywheel",
        "--data-dir",
        str(cfg.run_dir / "etcd"),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"flywheel={peer}",
    ]
    comp = Component(name="etcd", argv=argv, health_url=f"{client}/health", ports=[port, port + 1])
    return place(comp, cfg.hosts, hosts.control)
