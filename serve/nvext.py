"""What a client may set in Dynamo's ``nvext`` request extension, and see of it in the reply.

Probed against Dynamo 1.6.1's frontend (two mocker workers), every other field changes where or
what the engine runs, or reports on other teams: ``backend_instance_id``, ``decode_worker_id``,
``prefill_worker_id``, ``dp_rank``, ``prefill_dp_rank``, ``routing_constraints`` and ``router``
pin or steer worker choice; ``token_data`` replaces the prompt the gateway measured (the context
check and the budget's worst case would be of other tokens), and ``use_raw_prompt`` skips the
template; ``annotations`` return the formatted prompt, token ids and the chosen worker;
``agent_hints`` jump the router's queue; ``cache_salt`` overrides the team's prefix-cache salt;
``metadata_upload`` makes a worker write to a URL with its own credentials;
``request_timestamp_ms`` is a replay hint. Those are refused with a 400 naming what is allowed.

Of the reply's fields (``extra_fields``), ``worker_id`` names the instances a client would need
to pin one, ``timing`` carries the KV hit rate and router queue depth (a side channel on other
teams' prefixes and load), ``engine_data`` and ``routed_experts`` are engine internals: the
gateway asks for what a trace needs and hands a client only what it may ask for.
"""

from __future__ import annotations

from typing import Any

from serve.errors import APIError

# field -> the JSON type a client must give it
CLIENT_FIELDS: dict[str, type] = {"greed_sampling": bool, "max_thinking_tokens": int, "extra_fields": list}
CLIENT_REPLY_FIELDS = ("completion_token_ids", "stop_reason")
ADMIN_REPLY_FIELDS = CLIENT_REPLY_FIELDS + ("worker_id", "timing")  # an operator's, not a team's


def client_nvext(body: dict, admin: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The request's ``nvext``, checked (400s), and the reply fields it asked for (the admin
    key may also ask which worker served it, and its timing)."""
    raw = body.get("nvext")
    if raw is None:
        return {}, []
    if not isinstance(raw, dict):
        raise APIError(400, "nvext must be an object", param="nvext")
    for key, value in raw.items():
        kind = CLIENT_FIELDS.get(key)
        if kind is None:
            raise APIError(
                400,
                f"nvext.{key} cannot be set through the gateway; a client may set {', '.join(sorted(CLIENT_FIELDS))}",
                param=f"nvext.{key}",
            )
        if not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0)):
            raise APIError(400, f"nvext.{key} must be {_TYPE_NAMES[kind]}", param=f"nvext.{key}")
    asked = raw.get("extra_fields") or []
    allowed = ADMIN_REPLY_FIELDS if admin else CLIENT_REPLY_FIELDS
    for field in asked:
        if field not in allowed:
            raise APIError(400, f"nvext.extra_fields may name {', '.join(allowed)}, not {field!r}", param="nvext.extra_fields")
    return dict(raw), list(dict.fromkeys(asked))


_TYPE_NAMES = {bool: "true or false", int: "a non-negative integer", list: "a list of field names"}


def client_reply(nvext: dict, asked: list[str]) -> dict:
    """The reply's ``nvext`` as the client may see it: only the fields it asked for."""
    return {k: v for k, v in nvext.items() if k in asked}
