"""Session stickiness needs no configuration: a client that sends `X-Session-ID` through either
of two gateway replicas keeps the session on the worker that holds its prefix. An agentic replay
(multi-turn sessions on a shared system prefix, cold arrivals with long uncached prompts) on the
default sim profile (two Dynamo mocker workers, KV routing) reuses the ideal prefix cache."""

import time

import pytest

from deploy.bench.agentic import Target, run
from deploy.bench.workload import SessionShape, session_plan
from deploy.stack.config import load_config
from deploy.stack.launcher import down, gateway_component, up
from deploy.stack.processes import ProcessManager

pytestmark = pytest.mark.integration

# saturated on purpose: without affinity the KV router moves turns off their worker when the
# other one is less loaded (0.88-0.92 of the ideal reuse in the routing study)
SHAPE = SessionShape(
    sessions=24, turns=4, shared_prefix=256, history=1000, step=120, output=32, cold_fraction=0.2, cold_prompt=1500, seed=3
)  # within the sim's 2,048 tokens
CONCURRENCY = 12


def second_gateway(cfg, port: int) -> ProcessManager:
    """Another replica of the stack's gateway (same deployments, keys and store) on ``port``."""
    comp = gateway_component(cfg, cfg.resolved_gateway().model_copy(update={"port": port}), "gateway-2")
    pm = ProcessManager(cfg.run_dir)
    pm.start(comp)
    deadline = time.monotonic() + 60
    while not pm.check_ready(comp):
        assert time.monotonic() < deadline, "second gateway replica not healthy"
        time.sleep(0.2)
    pm.settle(comp.name)
    return pm


def replay(home, overrides: list[str]) -> dict:
    """The agentic replay through two gateway replicas (requests alternate between them) of a
    fresh default sim stack with ``overrides``."""
    cfg = load_config(
        "sim",
        [f"home={home}", "frontend.port=19800", "worker.system_port_base=19810", "gateway.port=19820", *overrides],
        environ={},
    )
    up(cfg)
    pm = None
    try:
        pm = second_gateway(cfg, 19821)
        key = cfg.resolved_gateway().admin_key
        target = Target(
            ["http://127.0.0.1:19820", "http://127.0.0.1:19821"],
            headers={"Authorization": f"Bearer {key}"},
            session_header="X-Session-ID",
        )
        result = run(target, session_plan(SHAPE), CONCURRENCY, block=cfg.worker.block_size)
    finally:
        if pm is not None:
            pm.stop("gateway-2")
        down(cfg)
    assert result["errors"] == 0, result.get("first_error")
    assert result["workers_used"] == 2
    return {k: result[k] for k in ("requests", "prefix_reuse_of_ideal", "sessions_on_one_worker")}


def test_sessions_stay_on_their_worker_by_default_across_gateway_replicas(tmp_path):
    cfg = load_config("sim", [], environ={})
    assert cfg.worker.count == 2 and cfg.frontend.router_mode == "kv"
    assert cfg.frontend.session_affinity_ttl_s > 0  # the default: nobody turned it on
    default = replay(tmp_path / "default", [])
    off = replay(tmp_path / "off", ["frontend.session_affinity_ttl_s=0"])
    print(f"\ndefault: {default}\naffinity off: {off}")
    assert default["sessions_on_one_worker"] == 1.0 and default["prefix_reuse_of_ideal"] >= 0.98, default
    # the same replay without affinity: the KV router moves turns to the less loaded worker
    assert off["sessions_on_one_worker"] < 0.9 and off["prefix_reuse_of_ideal"] < 0.95, off
