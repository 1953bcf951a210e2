"""The trace browser in a real browser (Debian's chromium driven by playwright) against a real
gateway process over a real store: team scoping, tokens with logprobs, filters, feedback into
`rewards`, the SQL console and its downloads, and untrusted content rendered as text."""

import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from feedback.registry import Registry
from serve.config import Deployment, GatewayConfig, ModelRoute
from serve.keys import KeyStore
from tests.conftest import free_port
from traces.feedback import write_feedback
from traces.writer import TraceWriter

pytestmark = pytest.mark.integration

XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"
RED_TRACES = 7  # tr-red-0..5 (a session of 6 turns, two checkpoints) and the hostile one


def _seed(root, tokenizer) -> dict:
    ids = tokenizer.encode("the quick brown fox jumps over the lazy dog").ids
    writer = TraceWriter(root, "seed")
    t0 = datetime.now(timezone.utc) - timedelta(minutes=10)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    for i in range(6):
        writer.write(
            {  # durable before the next turn, as the gateway answers a turn only then
                "trace_id": f"tr-red-{i}",
                "team": "red",
                "gen_ai_request_model": "tiny",
                "deployment": "local",
                "checkpoint_version": "base" if i < 3 else "lora-red-1",
                "gen_ai_conversation_id": "sess-red",
                "gen_ai_operation_name": "chat",
                "http_status": 200,
                "finish_reason": "stop",
                "gen_ai_input_messages": json.dumps([{"role": "user", "content": f"question {i}"}]),
                "response_content": "the quick brown fox",
                "prompt_token_ids": list(range(1, 100 + 20 * i)),
                "completion_token_ids": ids,
                "completion_logprobs": [-0.05 * (k + 1) for k in range(len(ids))],
                "time_received": at(i),
                "time_first_token": at(i + 0.02),
                "time_done": at(i + 0.2),
                "queue_wait_ms": 1.0,
                "ttft_ms": 20.0,
                "gen_ai_usage_input_tokens": 99 + 20 * i,
                "gen_ai_usage_output_tokens": len(ids),
            }
        )
    writer.submit(
        {
            "trace_id": "tr-red-xss",
            "team": "red",
            "gen_ai_request_model": "tiny",
            "http_status": 200,
            "checkpoint_version": "base",
            "time_received": at(10),
            "gen_ai_input_messages": json.dumps([{"role": "user", "content": XSS}]),
            "response_content": XSS,
            "response_reasoning": XSS,
            "response_tool_calls": json.dumps(
                [{"id": "c1", "type": "function", "function": {"name": XSS, "arguments": json.dumps({"q": XSS})}}]
            ),
        }
    )
    for i in range(3):
        writer.submit(
            {
                "trace_id": f"tr-blue-{i}",
                "team": "blue",
                "gen_ai_request_model": "tiny",
                "checkpoint_version": "lora-red-1",
                "http_status": 200,
                "time_received": at(20 + i),
                "response_content": "blue secret",
            }
        )
    writer.close()
    write_feedback(
        root,
        [
            {"trace_id": "tr-red-0", "team": "red", "name": "reward", "reward": 0.2},
            {"trace_id": "tr-red-3", "team": "red", "name": "reward", "reward": 0.8},
            {"trace_id": "tr-blue-0", "team": "blue", "name": "reward", "reward": -1.0},
        ],
    )
    return {"ids": ids}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, tiny_model_dir):
    from tokenizers import Tokenizer

    home = tmp_path_factory.mktemp("ui-home")
    seeded = _seed(home / "traces", Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    keys = KeyStore(home / "keys.json")
    _, red = keys.create("red")
    _, blue = keys.create("blue")
    registry = Registry(home / "checkpoints.json")
    registry.register(
        "lora-red-1",
        "lora",
        tiny_model_dir,
        str(tiny_model_dir),
        parent="base",
        dataset={"kind": "sft", "rows": 12, "sql": "SELECT 1"},
        turn=1,
        team="red",
    )
    registry.register(
        "lora-blue-1",
        "lora",
        tiny_model_dir,
        str(tiny_model_dir),
        parent="base",
        dataset={"kind": "sft", "rows": 5, "sql": "SELECT 'blue secret'"},
        env="blue-env",
        turn=1,
        team="blue",
    )
    port = free_port()
    cfg = GatewayConfig(
        port=port,
        traces_dir=str(home / "traces"),
        keys_file=str(home / "keys.json"),
        admin_key="admin-key",
        checkpoints_file=str(home / "checkpoints.json"),
        deployments=[Deployment(name="local", url="http://127.0.0.1:9", model_path=str(tiny_model_dir))],
        models={"tiny": ModelRoute(deployment="local", upstream_model="tiny")},
    )
    (home / "gateway.json").write_text(cfg.model_dump_json())
    log = open(home / "gateway.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve", "--config", str(home / "gateway.json")], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            pytest.fail(f"gateway did not start: {(home / 'gateway.log').read_text()[-2000:]}")
        yield {"url": url, "red": red, "blue": blue, **seeded}
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("Debian's chromium is not installed (apt-get install chromium; scripts/bootstrap.sh does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, gateway, tmp_path):
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.shots = tmp_path
    yield page
    context.close()


def login(page, gateway, key: str) -> None:
    page.goto(f"{gateway['url']}/ui/traces")
    assert "/ui/login" in page.url  # not logged in: the form, which comes back here
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/traces")


def trace_ids(page) -> list[str]:
    return page.locator("table.traces tbody td:nth-child(2) a").all_inner_texts()


def test_a_team_sees_only_its_traces_and_the_key_stays_out_of_the_browser(page, gateway):
    login(page, gateway, gateway["red"])
    page.screenshot(path=page.shots / "traces.png", full_page=True)
    ids = trace_ids(page)
    assert sorted(ids) == sorted([f"tr-red-{i}" for i in range(6)] + ["tr-red-xss"])
    assert "blue secret" not in page.content()
    page.goto(f"{gateway['url']}/ui/traces/tr-blue-0")
    assert "Not found" in page.inner_text("h1")
    assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read the session
    assert gateway["red"] not in page.evaluate("JSON.stringify(localStorage) + JSON.stringify(sessionStorage)")
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and gateway["red"] not in cookie["value"]
    page.click("header button:has-text('Log out')")
    page.goto(f"{gateway['url']}/ui/traces")
    assert "/ui/login" in page.url


def test_a_trace_shows_its_tokens_with_logprobs_and_its_session(page, gateway):
    login(page, gateway, gateway["red"])
    page.click("a:has-text('tr-red-4')")
    page.wait_for_url("**/ui/traces/tr-red-4")
    page.screenshot(path=page.shots / "trace.png", full_page=True)
    tokens = page.locator(".tokens .tok")
    assert tokens.count() == len(gateway["ids"])
    assert [int(i) for i in tokens.evaluate_all("ts => ts.map(t => t.dataset.tokenId)")] == gateway["ids"]
    assert "".join(tokens.all_inner_texts()).strip() == "the quick brown fox jumps over the lazy dog"
    first = tokens.first.get_attribute("title")
    assert f"id {gateway['ids'][0]}" in first and "logprob -0.0500" in first
    assert page.locator(".timing .seg").count() == 3
    page.click("a:has-text('sess-red')")
    page.wait_for_url("**/ui/sessions/sess-red")
    page.screenshot(path=page.shots / "session.png", full_page=True)
    rows = page.locator("table.turns tbody tr")
    assert rows.count() == 6
    # each turn's prompt extends the last one (the writer stores a reference to it, 64+ tokens shared)
    assert page.locator(".reused-n").all_inner_texts()[0] == "0"
    assert all(int(n) > 0 for n in page.locator(".reused-n").all_inner_texts()[1:])


def test_filter_by_checkpoint_and_search(page, gateway):
    login(page, gateway, gateway["red"])
    page.fill("input[name=checkpoint]", "lora-red-1")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**checkpoint=lora-red-1**")
    assert sorted(trace_ids(page)) == ["tr-red-3", "tr-red-4", "tr-red-5"]  # blue's lora-red-1 rows stay hidden
    page.goto(f"{gateway['url']}/ui/traces?q=question%203")
    assert trace_ids(page) == ["tr-red-3"]
    page.goto(f"{gateway['url']}/ui/checkpoints")
    page.screenshot(path=page.shots / "checkpoints.png", full_page=True)
    versions = page.locator("tr.checkpoint").evaluate_all("rs => rs.map(r => [r.dataset.version, r.dataset.parent])")
    assert versions == [["base", ""], ["lora-red-1", "base"]]
    lora = page.inner_text("tr.checkpoint[data-version='lora-red-1']")
    assert "12 rows" in lora and "0.800" in lora  # blue's -1 on a lora-red-1 trace is not red's
    assert "0.200" in page.inner_text("tr.checkpoint[data-version='base']")
    assert "lora-blue-1" not in page.content() and "blue secret" not in page.content()
    base_bar, lora_bar = page.locator("figure.chart").first.locator("rect").all()
    assert float(lora_bar.get_attribute("height")) == 4 * float(base_bar.get_attribute("height")) > 0
    page.goto(f"{gateway['url']}/ui/usage")
    page.screenshot(path=page.shots / "usage.png", full_page=True)
    assert "red" in page.inner_text("table.usage") and "blue" not in page.inner_text("table.usage")


def test_feedback_from_the_page_lands_in_rewards(page, gateway):
    login(page, gateway, gateway["red"])
    page.goto(f"{gateway['url']}/ui/traces/tr-red-1")
    page.fill("form.feedback-form input[name=reward]", "0.75")
    page.fill("form.feedback-form input[name=comment]", "good <b>answer</b>")
    page.click("form.feedback-form button[type=submit]")
    page.wait_for_url("**/ui/traces/tr-red-1#feedback")
    assert "good <b>answer</b>" in page.inner_text("table.feedback")
    r = httpx.post(
        f"{gateway['url']}/v1/traces/query",
        headers={"Authorization": f"Bearer {gateway['red']}"},
        json={"sql": "SELECT reward, comment FROM rewards WHERE trace_id = 'tr-red-1'"},
    )
    assert r.json()["rows"] == [[0.75, "good <b>answer</b>"]]
    page.goto(f"{gateway['url']}/ui/traces?reward_min=0.7&reward_max=0.76")
    assert trace_ids(page) == ["tr-red-1"]


def test_sql_console_runs_a_query_and_downloads_it(page, gateway, tmp_path):
    login(page, gateway, gateway["red"])
    page.goto(f"{gateway['url']}/ui/sql")
    page.fill("textarea[name=sql]", "SELECT trace_id, completion_token_ids FROM traces ORDER BY trace_id")
    page.click("form.sql button[type=submit]")
    page.screenshot(path=page.shots / "sql.png", full_page=True)
    cells = page.locator("table.result tbody td:first-child").all_inner_texts()
    assert cells == sorted([f"tr-red-{i}" for i in range(6)] + ["tr-red-xss"])
    with page.expect_download() as got:
        page.click("a.download:has-text('CSV')")
    csv_rows = pacsv.read_csv(got.value.path()).to_pylist()
    assert [r["trace_id"] for r in csv_rows] == cells
    assert json.loads(csv_rows[0]["completion_token_ids"]) == gateway["ids"]
    with page.expect_download() as got:
        page.click("a.download:has-text('Parquet')")
    assert pq.read_table(got.value.path()).column("trace_id").to_pylist() == cells
    page.fill("textarea[name=sql]", "SELECT * FROM read_parquet('/etc/*')")
    page.click("form.sql button[type=submit]")
    assert "not allowed" in page.inner_text(".error")


def test_hostile_content_renders_as_text(page, gateway):
    login(page, gateway, gateway["red"])
    page.goto(f"{gateway['url']}/ui/traces/tr-red-xss")
    page.screenshot(path=page.shots / "hostile.png", full_page=True)
    text = page.inner_text("main")
    assert text.count(XSS) >= 4  # message, reasoning, content, tool name; the arguments are JSON-escaped
    assert page.locator("main script, main img").count() == 0
    page.goto(f"{gateway['url']}/ui/traces")
    assert XSS[:40] in page.inner_text("table.traces")
    assert page.dialogs == []
