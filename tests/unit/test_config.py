import pytest

from deploy.config import load_config


def test_profile_then_environment_then_flags_take_precedence():
    cfg = load_config("local")
    assert cfg.gateway.port == 8000 and cfg.gateway.host == "127.0.0.1"
    env = {"FLYWHEEL_GATEWAY__PORT": "8001", "FLYWHEEL_WORKER__COUNT": "2"}
    cfg = load_config("local", environ=env)
    assert cfg.gateway.port == 8001 and cfg.worker.count == 2
    cfg = load_config("local", ["gateway.port=8002", "frontend.router_mode=round-robin"], environ=env)
    assert cfg.gateway.port == 8002 and cfg.frontend.router_mode == "round-robin"
    assert cfg.worker.count == 2


def test_unknown_profile_and_bad_values_are_clear_errors():
    with pytest.raises(ValueError, match="unknown profile 'nope'.*local"):
        load_config("nope", environ={})
    with pytest.raises(ValueError, match="router_mode"):
        load_config("local", ["frontend.router_mode=fastest"], environ={})
    with pytest.raises(ValueError, match="key.path=value"):
        load_config("local", ["gateway.port"], environ={})


def test_gateway_config_points_the_default_alias_at_the_local_deployment(tmp_path):
    cfg = load_config("local", [f"home={tmp_path}", "worker.count=2"], environ={})
    gw = cfg.resolved_gateway()
    assert gw.deployments[0].url == "http://127.0.0.1:8100"
    assert gw.deployments[0].admin_urls == ["http://127.0.0.1:8200", "http://127.0.0.1:8201"]
    assert gw.models["tiny"].upstream_model == "tiny"
    assert gw.traces_dir == str(tmp_path / "traces")
    assert gw.admin_key and gw.admin_key == cfg.resolved_gateway().admin_key  # stable per run dir
