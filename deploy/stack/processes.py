"""Start, watch and stop the stack's processes: one log and one PID file per process.

Each process runs in its own session (process group), so stopping it stops whatever it spawned
(vLLM's engine core, Dynamo's helpers) and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx


class StartError(RuntimeError):
    """A component could not start; the message carries the tail of its log."""


@dataclass
class Component:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_url: str | None = None
    ports: list[int] = field(default_factory=list)
    ready: Callable[[httpx.Response], bool] | None = None  # judges the health response
    host: str | None = None  # on a multi-host profile, the host it runs on (deploy/stack/netns.py)
    address: str = "127.0.0.1"  # where its ports listen
    exec_prefix: list[str] = field(default_factory=list)  # what runs it on its host


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


# Dynamo logs every non-200 answer of its health route; while a worker starts those are our own
# readiness polls, and they would push everything that says where the start-up is out of a tail.
_POLL_NOISE = "tower_http::trace::on_failure"


# While a component starts, the scheduling group of its session (the kernel's autogroup) runs
# at a higher priority. Every new process that imports torch has MKL count the cores by pinning
# itself to each CPU in turn (MKL_Read_ThreadENV_Count_Cores, from at::init_num_threads). A
# serving vLLM worker keeps its core busy (its input queue busy-waits for 1 s after every step),
# and a process pinned behind it got ~1 % of that core: the new worker of a blue-green start
# under load registered after 31-109 s (once over 300 s) instead of 21-24 s boosted, and a torch
# import pinned there took 22-98 s instead of 1-2 s boosted. Back to normal once healthy. Needs
# CAP_SYS_NICE; without it, no change.
START_BOOST_NICE = -5


def set_group_nice(pid: int, nice: int) -> bool:
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return True
    except OSError:  # no autogroups in this kernel, or not permitted to raise a priority
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join([line for line in text if _POLL_NOISE not in line][-lines:])


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ProcessManager:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}  # what this manager started, by name

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def recorded_pid(self, name: str) -> int | None:
        """The PID file's process, alive or not."""
        try:
            return int(self.pid_file(name).read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def pid(self, name: str) -> int | None:
        pid = self.recorded_pid(name)
        return pid if pid is not None and _alive(pid) else None

    def exit_reason(self, name: str) -> str:
        """Why a component's process is gone, as far as this manager can know."""
        child = self.children.get(name)
        if child is not None and child.poll() is not None:
            return describe_exit(child.returncode)
        last = log_tail(self.log_file(name), 1).strip()
        return "process gone (exit status unknown)" + (f"; last log line: {last[:200]}" if last else "")

    def describe_group(self, name: str) -> str:
        """Each live process of a component's group: pid, command, state, CPU seconds and the
        kernel function it sleeps in, so a start-up that hangs says whether it spins or waits."""
        pid = self.recorded_pid(name)
        return ", ".join(_describe(p) for p in group_pids(pid)) if pid else "none recorded"

    def start(self, comp: Component, boost: bool = True) -> int:
        """Start ``comp`` in a session of its own; ``boost``: at a higher priority until
        :meth:`settle` (see START_BOOST_NICE)."""
        if self.pid(comp.name):
            raise StartError(f"{comp.name} is already running (pid {self.pid(comp.name)}); run `flywheel down` first")
        for port in comp.ports:
            # a killed multi-threaded process shows as a zombie before its last thread has let
            # go of its sockets: give a just-stopped component a moment
            deadline = time.monotonic() + 5
            while port_in_use(port, comp.address) and time.monotonic() < deadline:
                time.sleep(0.1)
            if port_in_use(port, comp.address):
                raise StartError(
                    f"{comp.name}: port {port} on {comp.address} is already in use; "
                    "stop what holds it or choose another port in the profile"
                )
        log = open(self.log_file(comp.name), "ab")
        proc = subprocess.Popen(
            comp.exec_prefix + comp.argv,
            env={**os.environ, **comp.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.run_dir,
        )
        if boost:
            set_group_nice(proc.pid, START_BOOST_NICE)
        self.children[comp.name] = proc
        self.pid_file(comp.name).write_text(f"{proc.pid}\n{json.dumps(comp.argv)}\n")
        return proc.pid

    def settle(self, name: str) -> None:
        """A started component is healthy: its processes go back to the normal priority."""
        pid = self.pid(name)
        if pid is not None:
            set_group_nice(pid, 0)

    def check_ready(self, comp: Component) -> bool:
        """True when healthy; raises StartError when the process has died."""
        if not self.pid(comp.name):
            raise StartError(
                f"{comp.name} exited during start-up. Last lines of "
                f"{self.log_file(comp.name)}:\n{log_tail(self.log_file(comp.name))}"
            )
        if not comp.health_url:  # no HTTP health: ready once it listens
            return all(port_in_use(p, comp.address) for p in comp.ports)
        try:
            r = httpx.get(comp.health_url, timeout=2)
        except httpx.HTTPError:
            return False
        if comp.ready is not None:  # some health endpoints answer 503 with a useful body
            try:
                return bool(comp.ready(r))
            except (ValueError, httpx.HTTPError):
                return False
        return r.status_code == 200

    def stop(self, name: str, timeout: float = 20.0) -> bool:
        """SIGTERM the process group, SIGKILL after ``timeout``; True if something was stopped.
        A group whose leader already died (a vLLM engine core outliving its API process) is
        killed outright."""
        pid = self.recorded_pid(name)
        self.pid_file(name).unlink(missing_ok=True)
        if pid is None:
            return False
        if not _alive(pid):
            if _group_alive(pid):
                _signal_group(pid, signal.SIGKILL)
            self._reap(name)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.2)
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
        self._reap(name)
        return True

    def _reap(self, name: str) -> None:
        child = self.children.pop(name, None)
        if child is not None:
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def group_pids(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid`` (a component and what it spawned)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, IndexError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """A live process's command name and the fields of /proc/<pid>/stat after it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, rest = f.read().rsplit(") ", 1)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return head.split("(", 1)[1], rest.split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU a live process has used (0 once it is gone)."""
    stat = _stat(pid)
    return (int(stat[1][11]) + int(stat[1][12])) / os.sysconf("SC_CLK_TCK") if stat else 0.0


def _describe(pid: int) -> str:
    stat = _stat(pid)
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except (FileNotFoundError, ProcessLookupError):
        stat = None
    if stat is None:
        return f"{pid} (gone)"
    return f"{pid} {stat[0]} {stat[1][0]} {cpu_seconds(pid):.0f}s cpu wchan={wchan}"


def _group_alive(pgid: int) -> bool:
    return bool(group_pids(pgid))
