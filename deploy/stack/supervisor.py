"""Keeps the local stack up: `flywheel up` starts this loop as one more process of the stack.

Every ``poll_s`` it looks at each component `up` started and restarts, with exponential backoff:
- a component whose process is gone (crashed, killed, OOM), whatever is left of its process
  group killed first;
- a worker that is alive but no longer registered with the frontend. Dynamo's file discovery
  drops a worker whose keep-alive stalled past its 10 s TTL and never re-registers it (etcd's
  lease loss ends the runtime instead), so such a worker would stay unreachable for good.
  Which registered instance is which worker is read from the listening sockets: an instance's
  request-plane address is a port its worker process group listens on.
A restarted worker, once registered, loads again the LoRA adapters the alias table names.
Dedicated deployments' graphs are carried from the gateway's desired state into processes by
deploy/stack/reconciler.py on the same looks.

On several hosts there is one per host (``--host``, a node agent watching what runs there) and the
stack's own, which watches the agents (the hosts' init: an agent that died with its host comes
back, and brings its host's components back) and runs the reconciler.

They and `flywheel up` serialise on ``stack.lock`` (deploy/stack/run_state.py), so a restart never
races a start. What each did (restarts, last exit reason) goes to ``supervisor.json`` (an agent's
to ``supervisor-<host>.json``) for `flywheel status`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from deploy.stack.adapters import reload_adapters
from deploy.stack.config import StackConfig
from deploy.stack.frontend_instances import registered_ports
from deploy.stack.processes import Component, ProcessManager, StartError
from deploy.stack.reconciler import Reconciler
from deploy.stack.run_state import load_state, save_state, stack_lock
from deploy.stack.serverless import worker_index
from deploy.stack.sockets import group_listening_ports

log = logging.getLogger("flywheel.supervisor")


@dataclass
class Watch:
    """What the supervisor knows of one component."""

    restarts: int = 0
    last_exit: str | None = None
    last_restart: str | None = None
    failures_in_a_row: int = 0  # restarts that did not stay up for stable_s
    next_attempt: float = 0.0  # monotonic: not before this
    started: float = 0.0  # monotonic time of the last (re)start
    registered_at: str | None = None  # when this run of a worker was first seen in the frontend's instances
    adapters_pending: bool = False  # a restarted worker still has to load the table's LoRAs
    unlisted_since: float | None = None
    settling: bool = False  # restarted at start-up priority, not yet healthy


class Supervisor:
    def __init__(self, cfg: StackConfig, comps: list[Component], host: str | None = None):
        """Watches ``comps``; ``host``: a host's agent, which watches only what runs on it and
        leaves the dedicated deployments to the stack's supervisor."""
        self.cfg, self.sv, self.host = cfg, cfg.supervisor, host
        self.comps = [c for c in comps if c.name != "supervisor"]
        self.pm = ProcessManager(cfg.run_dir)
        self.watch = {c.name: Watch(started=time.monotonic()) for c in self.comps}
        self.dedicated = Reconciler(cfg, self.pm) if host is None else None
        for name, saved in load_state(cfg.run_dir).items():  # a restarted supervisor keeps counts
            if name in self.watch:
                self.watch[name].restarts = saved.get("restarts", 0)
                self.watch[name].last_exit = saved.get("last_exit")
                self.watch[name].last_restart = saved.get("last_restart")

    def tick(self) -> None:
        with stack_lock(self.cfg.run_dir, blocking=False) as held:
            if not held:  # `flywheel up` is starting things: leave them to it
                return
            listed = None
            for comp in self.comps:
                w, now = self.watch[comp.name], time.monotonic()
                if self.pm.pid(comp.name) is None:
                    w.unlisted_since = None
                    self._restart(comp, w, self.pm.exit_reason(comp.name), now)
                    continue
                if now - w.started > self.sv.stable_s:
                    w.failures_in_a_row = 0
                if w.settling:
                    self._settle(comp, w)
                if comp.name.startswith("worker-"):
                    if listed is None:
                        listed = registered_ports(self.cfg.frontend_url)
                    self._check_registration(comp, w, listed, now)
            if self.dedicated is not None:
                self.dedicated.tick()

    def _check_registration(self, comp: Component, w: Watch, listed: set[int] | None, now: float) -> None:
        """Restart worker ``comp`` once the frontend has not listed it for ``registration_grace_s``.
        A frontend that lists nobody counts: a sole worker (or every worker) can lapse too."""
        if listed is None:  # the frontend cannot say: the time unlisted starts again once it answers
            w.unlisted_since = None
            return
        pid = self.pm.pid(comp.name)
        if pid is not None and group_listening_ports(pid) & listed:
            w.unlisted_since = None
            if w.registered_at is None:
                w.registered_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
                self._save()
            if w.adapters_pending:
                self._reload_adapters(comp, w)
            return
        if w.registered_at is None:  # still starting, or a role the frontend never lists
            return
        if w.unlisted_since is None:
            w.unlisted_since = now
        elif now - w.unlisted_since >= self.sv.registration_grace_s:
            w.unlisted_since = None
            self._restart(
                comp,
                w,
                "alive but no longer registered with the frontend (its discovery keep-alive lapsed)",
                now,
                stop_first=True,
            )

    def _settle(self, comp: Component, w: Watch) -> None:
        try:
            ready = self.pm.check_ready(comp)
        except StartError:  # died meanwhile: the next look restarts it
            return
        if ready:
            self.pm.settle(comp.name)
            w.settling = False

    def _reload_adapters(self, comp: Component, w: Watch) -> None:
        try:
            names = reload_adapters(self.cfg, worker_index(comp.name))
        except (RuntimeError, httpx.HTTPError, ValueError) as exc:  # tried again next look
            log.warning("%s: adapters not loaded yet: %s", comp.name, exc)
            return
        w.adapters_pending = False
        if names:
            log.info("%s: loaded %s again", comp.name, ", ".join(names))

    def _restart(self, comp: Component, w: Watch, reason: str, now: float, stop_first: bool = False) -> None:
        if now < w.next_attempt:
            return
        if w.last_exit != reason:
            log.warning("%s: %s; restarting", comp.name, reason)
        w.last_exit = reason
        self.pm.stop(comp.name, timeout=5 if stop_first else 0)  # and any leftovers of its group
        w.failures_in_a_row += 1
        w.next_attempt = now + min(self.sv.backoff_initial_s * 2 ** (w.failures_in_a_row - 1), self.sv.backoff_max_s)
        try:
            self.pm.start(comp)
        except StartError as exc:
            w.last_exit = f"{reason}; restart failed: {exc}"
            log.warning("%s: %s", comp.name, w.last_exit)
        else:
            w.restarts += 1
            w.started, w.registered_at = time.monotonic(), None
            w.adapters_pending = comp.name.startswith("worker-")
            w.settling = True
            w.last_restart = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._save()

    def _save(self) -> None:
        state = {
            name: {k: v for k, v in asdict(w).items() if k in ("restarts", "last_exit", "last_restart", "registered_at")}
            for name, w in self.watch.items()
        }
        save_state(self.cfg.run_dir, state, self.host)

    def _next_look(self) -> float:
        return self.dedicated.next_look if self.dedicated is not None else float("inf")

    def run(self, stop: threading.Event) -> None:
        self._save()
        # sooner than poll_s while a dedicated deployment starts or drains (deploy/stack/reconciler.py)
        while not stop.wait(max(0.05, min(self.sv.poll_s, self._next_look() - time.monotonic()))):
            try:
                self.tick()
            except Exception:  # one bad look must not end the supervision
                log.exception("supervisor tick failed")


def watched_by(cfg: StackConfig, host: str | None) -> list[Component]:
    """On one host: every component. On several: a host's agent watches what runs on its host;
    the stack's supervisor plays the hosts' init and brings back an agent that died with its host."""
    from deploy.stack.launcher import components, supervisor_components

    if not cfg.hosts.enabled:
        return components(cfg)
    if host is None:
        return [c for c in supervisor_components(cfg) if c.host is not None]
    return [c for c in components(cfg) if c.host == host]


def main() -> None:
    parser = argparse.ArgumentParser(description="Flywheel stack supervisor")
    parser.add_argument("--config", required=True, help="resolved StackConfig as JSON")
    parser.add_argument("--host", help="on several hosts: watch what runs on this one (its agent)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health look is noise
    cfg = StackConfig.model_validate_json(Path(args.config).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Supervisor(cfg, watched_by(cfg, args.host), args.host).run(stop)


if __name__ == "__main__":
    main()
