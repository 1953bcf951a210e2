"""Traffic splits (serve/split.py): an arm per key, the same one every time, in the weights'
shares; a split body checked before anything changes."""

import pytest

from serve.config import ModelRoute
from serve.errors import APIError
from serve.split import choose_arm, shadow_arms, split_route


def arm(name: str, weight: float, **route) -> dict:
    route = {"deployment": "d", "upstream_model": "tiny", "checkpoint_version": name, **route}
    return {"route": route, "weight": weight, "name": name}


def test_each_key_takes_one_arm_always_and_the_arms_get_their_weights():
    route = split_route({"routes": [arm("stable", 0.7), arm("candidate", 0.2), arm("third", 0.1)]})
    assert (route.checkpoint_version, len(route.split)) == ("stable", 3)  # the first arm's fields
    taken = [choose_arm(route, f"team/session-{i}")[1] for i in range(20_000)]
    assert taken == [choose_arm(route, f"team/session-{i}")[1] for i in range(20_000)]
    for name, weight in (("stable", 0.7), ("candidate", 0.2), ("third", 0.1)):
        assert abs(taken.count(name) / len(taken) - weight) < 0.015, (name, taken.count(name))
    chosen, name = choose_arm(route, "team/session-0")
    assert chosen.checkpoint_version == name and chosen.split is None
    plain = ModelRoute(deployment="d", upstream_model="tiny")
    assert choose_arm(plain, "anything") == (plain, None)
    assert split_route({"routes": [arm("only", 1.0)]}).split is None  # one arm is a plain route


def test_a_shadow_arm_takes_no_request_and_gets_a_copy_of_its_share():
    route = split_route({"routes": [arm("stable", 1.0), {**arm("candidate", 0.25), "shadow": True}]})
    keys = [f"team/s-{i}" for i in range(20_000)]
    assert {choose_arm(route, k)[1] for k in keys} == {"stable"}  # its weight is not in the serving arms' sum
    copied = [k for k in keys if shadow_arms(route, k)]
    assert abs(len(copied) / len(keys) - 0.25) < 0.015
    assert copied == [k for k in keys if shadow_arms(route, k)]  # the same requests every time
    with pytest.raises(APIError):  # no serving arm at all
        split_route({"routes": [{**arm("candidate", 1.0), "shadow": True}, {**arm("other", 1.0), "shadow": True}]})


@pytest.mark.parametrize(
    "body",
    [
        {"routes": [arm("a", 0.5), arm("b", 0.4)]},  # sums to 0.9
        {"routes": [arm("a", 0.5), arm("a", 0.5)]},  # one name twice
        {"routes": [arm("a", 0.5), arm("b", 0.5, teams=["red"])]},  # seen by different teams
        {"routes": [arm("a", 1.5)]},
        {"routes": [arm("a", 0)]},
        {"routes": []},
        {"routes": [arm("a", 1.0)], "colour": "red"},
        {"routes": [{"route": {"deployment": "d"}, "weight": 1.0, "name": "a"}]},  # no upstream_model
    ],
)
def test_a_bad_split_is_a_400(body):
    with pytest.raises(APIError) as err:
        split_route(body)
    assert err.value.status == 400
