"""`/v1/models` is a catalog clients understand: OpenAI's fields, vLLM's (root, parent,
max_model_len), OpenRouter's (context_length, per-token pricing) and Prime's (usd per 1M tokens,
specs); prices are the ones `/v1/usage` charges, cached prompt tokens at the cached price."""

import asyncio

import pytest
from fastapi.testclient import TestClient

from serve.admission import Admission
from serve.app import create_app
from serve.config import Budget, Deployment, GatewayConfig, ModelRoute, Price
from serve.shared_state import SharedState

PRICES = {"tiny": Price(input_per_mtok=1.5, output_per_mtok=6.0, cached_input_per_mtok=0.15)}


@pytest.fixture
def client(tmp_path):
    cfg = GatewayConfig(
        deployments=[Deployment(name="d", url="http://127.0.0.1:9", max_model_len=2048, model_path="/m/tiny")],
        models={
            "tiny": ModelRoute(deployment="d", upstream_model="tiny"),
            "tiny-sft": ModelRoute(deployment="d", upstream_model="sft-3", lora_path="/ckpt/sft-3", checkpoint_version="sft-3"),
        },
        prices=PRICES,
        traces_dir=str(tmp_path / "traces"),
        keys_file=str(tmp_path / "keys.json"),
        admin_key="adm",
    )
    with TestClient(create_app(cfg)) as c:
        yield c


def test_each_model_lists_its_prices_context_and_lineage(client):
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    tiny, sft = cards["tiny"], cards["tiny-sft"]
    assert tiny["object"] == "model" and tiny["owned_by"] == "flywheel" and isinstance(tiny["created"], int)
    assert tiny["context_length"] == tiny["max_model_len"] == tiny["specs"]["context_window"] == 2048
    assert tiny["pricing"]["input_usd_per_mtok"] == 1.5 and tiny["pricing"]["output_usd_per_mtok"] == 6.0
    assert tiny["pricing"]["cache_read_usd_per_mtok"] == 0.15
    assert (tiny["pricing"]["prompt"], tiny["pricing"]["completion"]) == ("0.0000015", "0.000006")
    assert tiny["root"] == "/m/tiny" and tiny["parent"] is None and tiny["checkpoint_version"] == "base"
    # an unpriced alias is free, not unknown
    assert sft["pricing"]["input_usd_per_mtok"] == 0 and sft["pricing"]["prompt"] == "0"
    assert sft["parent"] == "tiny" and sft["root"] == "/ckpt/sft-3" and sft["checkpoint_version"] == "sft-3"


def test_one_model_by_id_and_an_unknown_one_is_a_404_in_the_openai_shape(client):
    assert client.get("/v1/models/tiny-sft").json() == next(
        m for m in client.get("/v1/models").json()["data"] if m["id"] == "tiny-sft"
    )
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_cached_prompt_tokens_are_charged_at_the_cached_price():
    adm = Admission(GatewayConfig(budgets={"red": Budget(usd=10.0)}, prices=PRICES), SharedState(None))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}

    async def go():
        a = await adm.admit("d", "red", "tiny", body)
        adm.release(a, "tiny", {"prompt_tokens": 1000, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 800}})

    asyncio.run(go())
    assert adm.usage("red")["spent_usd"] == pytest.approx((200 * 1.5 + 800 * 0.15 + 10 * 6.0) / 1e6, abs=1e-6)
