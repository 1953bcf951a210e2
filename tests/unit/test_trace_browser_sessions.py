"""The trace browser's sessions and forms: what a forged, expired or revoked session gets, and
what bad input on its pages gets (a page saying what is wrong, never a 500)."""

import base64
import json
import re
import time

import pytest

from serve.auth import Caller
from serve.keys import KeyStore
from serve.ui.session import COOKIE, Sessions, load_secret


def login(client, key):
    r = client.post("/ui/login", data={"key": key, "next": "/ui/traces"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return r


def csrf_of(client) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/traces").text).group(1)


def test_pages_need_a_login_and_come_back_after_it(setup):
    client, keys = setup
    r = client.get("/ui/traces?checkpoint=v1", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/traces%3Fcheckpoint%3Dv1"
    r = client.post("/ui/login", data={"key": "fw-not-a-key"})
    assert r.status_code == 401 and "not a valid" in r.text
    r = client.post("/ui/login", data={"key": keys["revoked"]})
    assert r.status_code == 401 and "revoked" in r.text
    r = client.post("/ui/login", data={"key": keys["red"], "next": "//evil.example/ui/"}, follow_redirects=False)
    assert r.headers["location"] == "/ui/traces"  # never a redirect off the site
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and keys["red"] not in cookie


def test_a_forged_or_tampered_cookie_is_no_session(setup):
    client, keys = setup
    login(client, keys["blue"])
    token = client.cookies[COOKIE]
    body, sig = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**payload, "team": "red"}).encode()).decode().rstrip("=")
    client.cookies.clear()
    assert client.get("/ui/traces", headers={"cookie": f"{COOKIE}={token}"}).status_code == 200
    for bad in (f"{forged}.{sig}", "garbage", f"{body}.{sig[:-2]}xx"):
        r = client.get("/ui/traces", headers={"cookie": f"{COOKIE}={bad}"}, follow_redirects=False)
        assert r.status_code == 303


def test_revoking_a_key_ends_its_browser_sessions(setup, tmp_path):
    client, keys = setup
    login(client, keys["red"])
    assert client.get("/ui/traces").status_code == 200
    store = KeyStore(tmp_path / "keys.json")
    (red,) = [k for k in store.list() if k.team == "red" and not k.revoked]
    time.sleep(0.01)  # a new mtime: the gateway re-reads the key file
    store.revoke(red.id)
    assert client.get("/ui/traces", follow_redirects=False).status_code == 303


def test_an_expired_session_is_no_session(tmp_path):
    sessions = Sessions(load_secret(str(tmp_path / "secret")), ttl_s=-1, keys=None)
    assert sessions.read(sessions.issue(Caller(team="admin", key_id="admin", admin=True))) is None
    fresh = Sessions(load_secret(str(tmp_path / "secret")), ttl_s=60, keys=None)
    assert fresh.read(fresh.issue(Caller(team="admin", key_id="admin", admin=True))).caller.admin
    # the file is the secret: another process reading it accepts the same cookies
    assert load_secret(str(tmp_path / "secret")) == load_secret(str(tmp_path / "secret"))


def test_forms_without_the_csrf_token_change_nothing(setup):
    client, keys = setup
    login(client, keys["red"])
    r = client.post("/ui/traces/tr-0/feedback", data={"reward": "1"})
    assert r.status_code == 403
    r = client.post("/ui/traces/tr-0/feedback", data={"reward": "1", "csrf": csrf_of(client)})
    table = r.text.split('id="feedback"')[1].split("</table>")[0]
    assert r.status_code == 200 and "<td>ui</td>" in table  # stored (source "ui") by POST /v1/feedback's code
    assert client.post("/ui/logout", data={}).status_code == 403


@pytest.mark.parametrize(
    "query, message",
    [
        ("since=yesterday", "since must be a date"),
        ("reward_min=high", "reward_min must be a number"),
        ("status=maybe", "status is 'ok' or 'error'"),
    ],
)
def test_a_bad_filter_is_a_400_page_saying_why(setup, query, message):
    client, keys = setup
    login(client, keys["red"])
    r = client.get(f"/ui/traces?{query}")
    assert r.status_code == 400 and message in r.text.replace("&#39;", "'")


def test_bad_feedback_and_bad_sql_are_400_pages(setup):
    client, keys = setup
    login(client, keys["red"])
    csrf = csrf_of(client)
    r = client.post("/ui/traces/tr-0/feedback", data={"csrf": csrf, "reward": "high"})
    assert r.status_code == 400 and "reward" in r.text
    r = client.post("/ui/traces/tr-0/feedback", data={"csrf": csrf})
    assert r.status_code == 400 and "at least one of" in r.text
    assert client.post("/ui/traces/tr-5/feedback", data={"csrf": csrf, "reward": "1"}).status_code == 404  # blue's
    r = client.post("/ui/sql", data={"csrf": csrf, "sql": "DROP TABLE traces"})
    assert r.status_code == 400 and "only SELECT" in r.text
    r = client.post("/ui/sql", data={"csrf": csrf, "sql": "SELECT nope FROM traces"})
    assert r.status_code == 400 and "query failed" in r.text
    assert client.get("/ui/sql/download?sql=SELECT%201&format=xlsx").status_code == 400


def test_the_admin_sees_every_team(setup):
    client, keys = setup
    login(client, keys["admin"])
    text = client.get("/ui/traces").text
    assert all(f"/ui/traces/tr-{i}" in text for i in range(6))
    assert "admin (all teams)" in text


def test_a_team_sees_only_its_checkpoints_and_not_what_trained_another_teams(tmp_path):
    from feedback.registry import Registry
    from tests.unit.conftest import seeded_gateway

    registry = Registry(tmp_path / "checkpoints.json")
    (tmp_path / "ck").mkdir()
    registry.register(
        "blue-ck",
        "lora",
        tmp_path / "ck",
        "base",
        parent="base",
        team="blue",
        env="blue-env-9",
        dataset={"kind": "rl", "rows": 3, "sql": "SELECT 'blue secret'"},
    )
    with seeded_gateway(tmp_path, checkpoints_file=str(tmp_path / "checkpoints.json")) as (client, keys):
        login(client, keys["red"])
        page = client.get("/ui/checkpoints").text
        assert "blue-ck" not in page and "blue secret" not in page and "blue-env-9" not in page
        client.cookies.clear()
        login(client, keys["admin"])
        assert "blue secret" in client.get("/ui/checkpoints").text


@pytest.mark.parametrize(
    "query",
    ["page=1000000000000000000000", "since=9999-12-31T23:59:59-05:00", "until=0001-01-01T00:00:00%2B05:00", "since=yesterday"],
)
def test_a_huge_page_or_an_out_of_range_time_is_a_400_page(setup, query):
    client, keys = setup
    login(client, keys["red"])
    r = client.get(f"/ui/traces?{query}")
    assert r.status_code == 400, r.text[:300]
