"""No web page on another site can drive the gateway through a browser: not the local profile's
open API (DNS rebinding included), not the trace browser's session."""

import pytest

from tests.unit.conftest import seeded_gateway
from tests.unit.test_gateway_errors import CHAT, client  # noqa: F401 (fixture)
from tests.unit.test_trace_browser_sessions import csrf_of, login


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example", "Host": "127.0.0.1:8000"},  # a cross-site fetch or form
        {"Sec-Fetch-Site": "cross-site", "Host": "127.0.0.1:8000"},
        {"Origin": "null", "Host": "127.0.0.1:8000"},  # a sandboxed frame
        {"Origin": "http://evil.example:8000", "Host": "evil.example:8000"},  # DNS rebinding
    ],
)
def test_a_browser_on_another_site_is_refused_with_keys_off(client, headers):  # noqa: F811
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/feedback", {"trace_id": "t", "reward": 1})):
        r = client.post(path, json=body, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site_refused", (path, r.text)


def test_rebinding_cannot_read_either(client):  # noqa: F811
    r = client.get("/v1/models", headers={"Sec-Fetch-Site": "same-origin", "Host": "evil.example:8000"})
    assert r.status_code == 403


def test_the_gateway_itself_in_a_browser_and_programs_are_served(client):  # noqa: F811
    same = {"Origin": "http://127.0.0.1:8000", "Host": "127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
    assert client.get("/v1/models", headers=same).status_code == 200
    assert client.post("/v1/feedback", json={"trace_id": "t", "reward": 1}, headers=same).status_code == 200
    assert client.post("/v1/feedback", json={"trace_id": "t", "reward": 1}).status_code == 200  # no browser headers


def test_the_trace_browser_refuses_cross_site_posts_even_with_keys_on(tmp_path):
    with seeded_gateway(tmp_path, require_api_key=True) as (client, keys):
        r = client.post("/ui/login", data={"key": keys["red"]}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403  # login CSRF: logging a victim into the attacker's team
        login(client, keys["red"])
        token = csrf_of(client)
        r = client.post("/ui/traces/tr-0/feedback", data={"csrf": token, "reward": "1"}, headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403


def test_an_admin_session_ends_when_the_admin_key_changes(tmp_path):
    secret = str(tmp_path / "ui.secret")
    with seeded_gateway(tmp_path, ui={"secret_file": secret}) as (client, keys):
        login(client, keys["admin"])
        cookie = client.cookies.get("fw_session")
        assert client.get("/ui/traces", follow_redirects=False).status_code == 200
    with seeded_gateway(tmp_path / "rotated", admin_key="new-admin-key", ui={"secret_file": secret}) as (client, _):
        client.cookies.set("fw_session", cookie, path="/ui")
        assert client.get("/ui/traces", follow_redirects=False).status_code == 303  # to the login form


@pytest.mark.parametrize("cookie", ["é.x", "a.ü", "ünïcode"])
def test_a_non_ascii_cookie_or_csrf_token_is_not_a_500(tmp_path, cookie):
    with seeded_gateway(tmp_path) as (client, keys):
        raw = {"Cookie": f"fw_session={cookie}".encode()}  # UTF-8 bytes, as a hostile client sends them
        assert client.get("/ui/traces", headers=raw, follow_redirects=False).status_code == 303
        login(client, keys["red"])
        r = client.post("/ui/traces/tr-0/feedback", data={"csrf": "ünï", "reward": "1"})
        assert r.status_code == 403
