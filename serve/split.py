"""Traffic splits: an alias over several routes with weights (``PUT /admin/models/<alias>
{"routes": [{"route": {...}, "weight": 0.9, "name": "stable"}, ...]}``), so a candidate checkpoint
serves a share of traffic beside the one serving now.

An arm is chosen by hashing the request's key (its team-scoped session, or its trace id without
one) to a point in [0, 1) and taking the arm whose cumulative weight covers it: the same session
always lands on the same arm, through any gateway replica, with no shared state to keep, and the
shares are the weights' over many sessions. Each trace records its arm (the ``arm`` column) and
the arm route's checkpoint version.

A shadow arm (``"shadow": true``) serves no client: a copy of its ``weight`` share of requests
(chosen by the same hash, salted with its name) goes to it, its answer is traced and dropped, so
a candidate is scored on real traffic before anyone sees it. The serving arms' weights sum to 1.
"""

from __future__ import annotations

import hashlib

from pydantic import Field, ValidationError

from serve.config import Arm, ModelRoute, StrictModel
from serve.errors import APIError, invalid_request

WEIGHT_SUM_TOLERANCE = 1e-6


def _point(key: str) -> float:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def choose_arm(route: ModelRoute, key: str) -> tuple[ModelRoute, str | None]:
    """The route a request with ``key`` takes, and its arm's name (None: no split)."""
    serving = [a for a in route.split or [] if not a.shadow]
    if not serving:
        return route, None
    point, covered = _point(key), 0.0
    for arm in serving:
        covered += arm.weight
        if point < covered:
            return arm.route, arm.name
    return serving[-1].route, serving[-1].name  # the weights' rounding: the last arm


def shadow_arms(route: ModelRoute, key: str) -> list[Arm]:
    """The shadow arms a request with ``key`` is copied to."""
    return [a for a in route.split or [] if a.shadow and _point(f"{key}#{a.name}") < a.weight]


class SplitRequest(StrictModel):
    routes: list[Arm] = Field(min_length=1, description="the arms; their weights sum to 1")


def split_route(body: dict) -> ModelRoute:
    """A PUT body of ``routes`` made into one route: the first serving arm's fields, with the split."""
    try:
        arms = SplitRequest.model_validate(body).routes
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    total = sum(a.weight for a in arms if not a.shadow)
    if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
        raise APIError(400, f"the serving arms' weights must sum to 1; they sum to {total:g}", param="routes")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise APIError(400, f"each arm needs a name of its own: {names}", param="routes")
    if any(a.route.split for a in arms):
        raise APIError(400, "an arm's route cannot be a split itself", param="routes")
    if len({None if a.route.teams is None else tuple(sorted(a.route.teams)) for a in arms}) != 1:
        raise APIError(400, "every arm must be visible to the same teams", param="routes")
    if len(arms) == 1:
        return arms[0].route
    first = next(a for a in arms if not a.shadow)
    return first.route.model_copy(update={"split": arms})
