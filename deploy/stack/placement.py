"""Which worker host runs each replica of a dedicated deployment, on a profile with several hosts.

A worker host offers ``slots`` (the pool's unit: a replica holds the pool's ``slots_per_replica``);
the profile's own workers take theirs first. A new replica goes to the host with the most free
slots that fit it (a tie: the host running fewer workers, then the hosts' order), so replicas
spread the way a scheduler's least-allocated rule spreads pods. A replica keeps its host for as long
as it is wanted or still runs (a draining one holds its slots), in ``<run>/placements.json``, so a
supervisor restart or a crashed worker does not move it. A host without ``slots`` is bounded only by
the pool. A replica that fits no host is not started: it waits until slots are freed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from deploy.stack.config import StackConfig

log = logging.getLogger("flywheel.placement")
PLACEMENTS_FILE = "placements.json"


def load(run_dir: Path) -> dict[str, dict]:
    """Worker process name -> {"host": its host's name, "slots": what it holds there}."""
    try:
        return json.loads((run_dir / PLACEMENTS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def place(cfg: StackConfig, wanted: dict[str, int], running: set[str]) -> dict[str, str]:
    """Hosts for the dedicated workers ``wanted`` (name -> the slots it needs), given the worker
    processes ``running`` now: what was placed keeps its host, a new one gets the host with the
    most free slots. Returns name -> host name for every worker that has one: the wanted, and
    the running ones no longer wanted (draining: their admin URL is on that host)."""
    known = load(cfg.run_dir)
    table = {name: p for name, p in known.items() if name in wanted or name in running}
    hosts = cfg.hosts.with_role("worker")
    free = {h.name: math.inf if h.slots is None else h.slots for h in hosts}
    workers = dict.fromkeys(free, 0)
    per_replica = cfg.resolved_gateway().pool.slots_per_replica
    for i in range(cfg.worker.count):  # the profile's own workers
        name = cfg.hosts.worker_host(i).name
        free[name] -= per_replica
        workers[name] += 1
    for p in table.values():
        if p["host"] in free:
            free[p["host"]] -= p["slots"]
            workers[p["host"]] += 1
    for name in [n for n in wanted if n not in table]:
        fits = [h.name for h in hosts if free[h.name] >= wanted[name]]
        if not fits:
            log.warning("%s: no worker host has %d free slot(s) (%s); it starts once some are freed", name, wanted[name], free)
            continue
        host = min(fits, key=lambda h: (-free[h], workers[h], fits.index(h)))
        table[name] = {"host": host, "slots": wanted[name]}
        free[host] -= wanted[name]
        workers[host] += 1
    if table != known:  # the supervisor looks every 0.1 s while a deployment converges
        path = cfg.run_dir / PLACEMENTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, sort_keys=True))
        os.replace(tmp, path)
    return {name: p["host"] for name, p in table.items()}
