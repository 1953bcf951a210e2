"""A table shared by gateway replicas through Redis: a change through one replica never writes
away a change another made that it has not taken up yet (each change writes its own row)."""

from serve.config import ModelRoute
from serve.routes import RouteTable
from serve.shared_state import SharedState


def route(version: str) -> ModelRoute:
    return ModelRoute(deployment="d", upstream_model="tiny", checkpoint_version=version, created=1)


def test_changes_through_two_replicas_in_one_poll_interval_are_both_kept(redis_server, tmp_path):
    a = RouteTable({}, SharedState(redis_server.url), tmp_path / "a.json")
    b = RouteTable({}, SharedState(redis_server.url), tmp_path / "b.json")
    a["one"] = route("v1")
    b["two"] = route("v2")  # b has not polled: its copy has no "one"
    a["one"] = route("v1b")
    del b["two"]
    b["three"] = route("v3")
    for replica in (a, b):
        replica.refresh()
    assert {k: r.checkpoint_version for k, r in a.items()} == {"one": "v1b", "three": "v3"}
    assert dict(a) == dict(b)
    fresh = RouteTable({}, SharedState(redis_server.url), tmp_path / "c.json")  # a replica started now
    assert dict(fresh) == dict(a)
