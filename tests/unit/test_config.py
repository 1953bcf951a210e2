import json

import pytest

from deploy.stack.config import load_config
from deploy.stack.launcher import components


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
    assert gw.admin_key is None and not list(tmp_path.rglob("*"))  # reading the config wrote nothing
    key = cfg.ensure_admin_key()  # what `up` does first
    assert key == cfg.resolved_gateway().admin_key == cfg.ensure_admin_key()  # stable per run dir
    assert (cfg.admin_key_file.stat().st_mode & 0o777) == 0o600


def test_secret_files_are_private_from_their_first_byte(tmp_path, monkeypatch):
    import os

    from deploy.stack.launcher import components
    from serve.keys import KeyStore
    from serve.secret_files import write_private

    modes = []
    real_open = os.open

    def watching_open(path, flags, mode=0o777, *a, **kw):  # the mode each secret is created with
        if flags & os.O_CREAT:
            modes.append((os.path.basename(path), mode))
        return real_open(path, flags, mode, *a, **kw)

    monkeypatch.setattr(os, "open", watching_open)
    cfg = load_config("local", [f"home={tmp_path}"], environ={})
    cfg.ensure_admin_key()
    components(cfg)  # writes gateway.json, which holds the admin key
    KeyStore(tmp_path / "keys.json").create("red")
    write_private(tmp_path / "old", "x")
    (tmp_path / "old").chmod(0o644)
    write_private(tmp_path / "old", "y")  # replacing a world-readable file makes it private
    assert modes and all(mode == 0o600 for _, mode in modes), modes
    for name in ("run/admin.key", "run/gateway.json", "keys.json", "old"):
        assert ((tmp_path / name).stat().st_mode & 0o777) == 0o600, name


def test_a_team_named_admin_or_default_is_refused(tmp_path):
    import pytest

    from serve.keys import KeyStore

    store = KeyStore(tmp_path / "keys.json")
    for name in ("admin", "default", "Admin"):
        with pytest.raises(ValueError, match="reserved"):
            store.create(name)
    assert store.create("red")[0].team == "red"


def _args(comp, flag):
    return comp.argv[comp.argv.index(flag) + 1] if flag in comp.argv else None


def test_a_prefill_decode_split_and_the_engine_knobs_reach_every_worker(tmp_path):
    cfg = load_config(
        "sim",
        [
            f"home={tmp_path}",
            "worker.count=4",
            "worker.disaggregated=true",
            "worker.prefill_count=3",
            "worker.max_num_batched_tokens=4096",
            "worker.num_kv_blocks=512",
            "frontend.session_affinity_ttl_s=300",
        ],
        environ={},
    )
    comps = {c.name: c for c in components(cfg)}
    roles = [_args(comps[f"worker-{i}"], "--disaggregation-mode") for i in range(4)]
    assert roles == ["prefill", "prefill", "prefill", "decode"]
    for i in range(4):
        assert _args(comps[f"worker-{i}"], "--max-num-batched-tokens") == "4096"
        assert _args(comps[f"worker-{i}"], "--num-gpu-blocks-override") == "512"
    assert _args(comps["frontend"], "--router-session-affinity-ttl-secs") == "300"


def test_the_host_tier_starts_a_mooncake_master_and_wires_the_workers_to_it(tmp_path):
    cfg = load_config("local-tiered", [f"home={tmp_path}", "host_tier.rpc_port=18551"], environ={})
    comps = {c.name: c for c in components(cfg)}
    assert "--rpc_port=18551" in comps["mooncake-master"].argv
    # the master's own metadata server ignores its host flag: a separate one on loopback instead
    assert not any("metadata" in a for a in comps["mooncake-master"].argv)
    assert comps["mooncake-metadata"].argv[1:5] == ["--host", "127.0.0.1", "--port", "8180"]
    worker = comps["worker-0"]
    assert json.loads(_args(worker, "--kv-transfer-config"))["kv_connector"] == "MooncakeStoreConnector"
    store = json.loads(open(worker.env["MOONCAKE_CONFIG_PATH"]).read())
    assert worker.env["LD_PRELOAD"].endswith("loopback_bind.so")  # the transfer engine's listeners
    assert store["master_server_address"] == "127.0.0.1:18551" and store["protocol"] == "tcp"
    # with prefill/decode on as well, NIXL and the store are chained behind one MultiConnector
    pd = load_config("local-tiered", [f"home={tmp_path}", "worker.count=2", "worker.disaggregated=true"], environ={})
    kv = json.loads(_args({c.name: c for c in components(pd)}["worker-1"], "--kv-transfer-config"))
    assert [c["kv_connector"] for c in kv["kv_connector_extra_config"]["connectors"]] == [
        "NixlConnector",
        "MooncakeStoreConnector",
    ]


@pytest.mark.parametrize(
    "overrides, environ, wrong, meant",
    [
        (["gateway.prot=8001"], {}, "gateway.prot", "gateway.port"),
        (["worker.cuont=3"], {}, "worker.cuont", "worker.count"),
        ([], {"FLYWHEEL_GATEWAY_PORT": "9"}, "gateway_port", "gateway.port"),
        (["gateway.prices.tiny.output=0.4"], {}, "gateway.prices.tiny.output", "gateway.prices.tiny.output_per_mtok"),
    ],
)
def test_an_unknown_config_key_is_an_error_naming_the_closest_valid_key(tmp_path, overrides, environ, wrong, meant):
    with pytest.raises(ValueError) as err:
        load_config("local", [f"home={tmp_path}", *overrides], environ=environ)
    assert repr(wrong) in str(err.value) and repr(meant) in str(err.value)


def test_every_profile_loads_with_strict_keys():
    from deploy.stack.config import PROFILES_DIR

    for profile in PROFILES_DIR.glob("*.toml"):
        load_config(profile.stem, environ={})


def test_the_supervisor_finds_the_stack_when_the_home_was_given_relative(tmp_path, monkeypatch):
    """It runs in the run dir: a relative home must not be read again from there (it was, and the
    supervisor restarted components it could not see into a nested run dir)."""
    from deploy.stack.config import StackConfig
    from deploy.stack.launcher import supervisor_components

    monkeypatch.chdir(tmp_path)
    cfg = load_config("local", ["home=.flywheel", "model_dir=models/mine"], environ={})
    argv = supervisor_components(cfg)[0].argv
    monkeypatch.chdir(cfg.run_dir)
    seen = StackConfig.model_validate_json(open(argv[argv.index("--config") + 1]).read())
    assert seen.run_dir == tmp_path / ".flywheel" / "run"
    assert seen.model_path == tmp_path / "models" / "mine"
    assert seen.resolved_gateway().traces_dir == str(tmp_path / ".flywheel" / "traces")


def test_the_gateway_url_is_built_in_one_place_and_brackets_an_ipv6_host():
    from serve.config import GatewayConfig

    assert GatewayConfig(host="127.0.0.1", port=8000).url == "http://127.0.0.1:8000"
    assert GatewayConfig(host="::1", port=8000).url == "http://[::1]:8000"
    cfg = load_config("local", ["home=/tmp/flywheel-url-test", "gateway.port=18123"], environ={})
    gw = cfg.resolved_gateway()
    assert gw.url == "http://127.0.0.1:18123" and gw.checkpoints_file.endswith("checkpoints.json")
