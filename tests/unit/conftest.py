"""A gateway (FastAPI TestClient) over a store seeded with 4 red and 2 blue traces, and keys."""

from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from serve.app import create_app
from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore
from traces.writer import TraceWriter


@pytest.fixture
def setup(tmp_path):
    """(client, {'red': key, 'blue': key, 'revoked': key, 'admin': key})"""
    with seeded_gateway(tmp_path) as found:
        yield found


@contextmanager
def seeded_gateway(tmp_path, **config):
    """The ``setup`` fixture's gateway, with ``config`` set on its GatewayConfig."""
    root = tmp_path / "traces"
    writer = TraceWriter(root, "seed")
    for i in range(6):
        writer.submit(
            {
                "trace_id": f"tr-{i}",
                "team": "red" if i < 4 else "blue",
                "gen_ai_request_model": "tiny",
                "http_status": 200,
                "prompt_token_ids": [1, 2, 3],
                "completion_token_ids": [i],
            }
        )
    writer.close()
    keys = KeyStore(tmp_path / "keys.json")
    _, red = keys.create("red")
    _, blue = keys.create("blue")
    revoked_rec, revoked = keys.create("red")
    keys.revoke(revoked_rec.id)
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9")],
        models={"tiny": ModelRoute(deployment="d", upstream_model="tiny")},
        traces_dir=str(root),
        keys_file=str(tmp_path / "keys.json"),
        **{"admin_key": "adm", **config},
    )
    with TestClient(create_app(cfg)) as client:
        yield client, {"red": red, "blue": blue, "revoked": revoked, "admin": cfg.admin_key}
