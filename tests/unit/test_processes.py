import socket
import sys

import pytest

from deploy.stack.processes import Component, ProcessManager, StartError


def test_a_taken_port_is_reported_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        pm = ProcessManager(tmp_path)
        comp = Component("svc", [sys.executable, "-c", "pass"], ports=[port])
        with pytest.raises(StartError, match=f"port {port} .* already in use"):
            pm.start(comp)
        assert pm.pid("svc") is None


def test_a_process_that_dies_during_startup_shows_its_log_tail(tmp_path):
    pm = ProcessManager(tmp_path)
    comp = Component(
        "svc",
        [sys.executable, "-c", "print('model file is corrupt'); raise SystemExit(3)"],
        health_url="http://127.0.0.1:9/health",
    )
    pm.start(comp)
    with pytest.raises(StartError, match="(?s)svc exited during start-up.*model file is corrupt"):
        for _ in range(100):
            pm.check_ready(comp)
            import time

            time.sleep(0.05)


def test_stop_ends_the_whole_process_group_and_only_it(tmp_path):
    pm = ProcessManager(tmp_path)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    pid = pm.start(Component("parent", [sys.executable, "-c", code]))
    import time

    time.sleep(0.5)
    assert pm.pid("parent") == pid
    assert pm.stop("parent", timeout=5)
    from deploy.stack.processes import _group_alive

    assert not _group_alive(pid)
    assert pm.pid("parent") is None and not pm.stop("parent")


def _autogroup_nice(pid: int) -> int:
    return int(open(f"/proc/{pid}/autogroup").read().split("nice")[1])


def test_a_starting_component_and_its_children_run_boosted_until_settled(tmp_path):
    """A process that imports torch pins itself to each CPU in turn (MKL counting cores); behind
    a serving vLLM worker's busy core it starved for minutes. Starting components get a higher
    priority for their whole session until healthy; the supervisor itself never does."""
    pm = ProcessManager(tmp_path)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    pid = pm.start(Component("engine", [sys.executable, "-c", code]))
    quiet = pm.start(Component("watcher", [sys.executable, "-c", "import time; time.sleep(60)"]), boost=False)
    try:
        import time
        from deploy.stack.processes import START_BOOST_NICE, group_pids

        deadline = time.monotonic() + 10
        while len(group_pids(pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        family = group_pids(pid)
        assert len(family) == 2 and all(_autogroup_nice(p) == START_BOOST_NICE < 0 for p in family)
        assert _autogroup_nice(quiet) == 0
        pm.settle("engine")
        assert all(_autogroup_nice(p) == 0 for p in family)
    finally:
        pm.stop("engine", timeout=5)
        pm.stop("watcher", timeout=5)


def test_a_start_that_never_gets_healthy_says_what_its_processes_do_and_what_they_logged(tmp_path):
    from deploy.stack.config import load_config
    from deploy.stack.launcher import start_components

    cfg = load_config("local", [f"home={tmp_path}", "start_timeout_s=1"], environ={})
    code = "print('loading weights', flush=True); import time; time.sleep(60)"
    hung = Component("hung", [sys.executable, "-c", code], health_url="http://127.0.0.1:9/health")
    with pytest.raises(StartError, match=r"(?s)hung not healthy after 1 s; processes: \d+ python S .*loading weights"):
        start_components(cfg, [hung])
    assert ProcessManager(cfg.run_dir).pid("hung") is None  # what the failed start began is stopped
