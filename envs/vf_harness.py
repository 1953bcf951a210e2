"""A verifiers harness whose chat loop runs in this process (harness id ``envs.vf_harness``).

verifiers' stock ``null`` harness runs the loop as a separate program that ``uv`` installs on
first use; this one needs nothing installed at run time. It talks to the endpoint verifiers
gives it (its interception server, which forwards to the gateway and records the trace),
calls the task's MCP tools when the model asks, and stops when the model answers without a
tool call or the server ends the rollout (max turns). A turn the gateway refused for now (429,
503 while a worker restarts) or a deployment failed (5xx, which the interception server passes
on) is sent again a few times, and so is a turn whose connection failed (under one idempotency
key: the server commits it once); 409 and 400 are the server ending the rollout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from contextlib import AsyncExitStack

import httpx

import verifiers.v1 as vf
from openai import APIConnectionError, APIStatusError, AsyncOpenAI
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.interception.server import IDEMPOTENCY_KEY_HEADER


log = logging.getLogger(__name__)
RETRIED = (429, 500, 502, 503, 504)
TRIES = 4
MAX_WAIT_S = 10.0
# To the interception server, as verifiers' own clients: 30 s to connect, reads unbounded (the
# rollout's timeout bounds a turn), and as many turns at once as rollouts (httpx's default pool
# of 100 would hold back the rest).
TIMEOUT = httpx.Timeout(None, connect=30.0)
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)

# One HTTP client per event loop for every rollout on it. Building a client costs ~20 ms of the
# loop (its TLS context); 256 rollouts starting together each building theirs stalled the loop
# past the SDK's 5 s connect timeout, and a turn was lost with "Request timed out".
_http_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def shared_http() -> httpx.AsyncClient:
    """The HTTP client of the running event loop's rollouts."""
    loop = asyncio.get_running_loop()
    if loop not in _http_clients:
        _http_clients[loop] = httpx.AsyncClient(timeout=TIMEOUT, limits=LIMITS)
    return _http_clients[loop]


async def complete(client: AsyncOpenAI, **request):
    """One chat turn, sent up to ``TRIES`` times while it is answered one of ``RETRIED`` (after
    the response's ``Retry-After``, else 0.5, 1, 2 s) or its connection failed; None once the
    rollout has ended. Every try carries the turn's own ``Idempotency-Key``: verifiers'
    interception server commits one turn per key, and answers a try of a turn it already has
    with that turn (in flight: once it is done), so a connection lost after the request was
    sent is safe to try again (CI once lost an episode to one, of 4,096)."""
    headers = {**request.pop("extra_headers", {}), IDEMPOTENCY_KEY_HEADER: f"turn-{uuid.uuid4().hex}"}
    for attempt in range(TRIES):
        try:
            return await client.chat.completions.create(**request, extra_headers=headers)
        except APIConnectionError as exc:
            if attempt == TRIES - 1:
                raise
            log.warning("turn sent again: its connection failed (%r)", exc.__cause__)
            await asyncio.sleep(_backoff_s(attempt))
        except APIStatusError as exc:
            if exc.status_code not in RETRIED:  # the interception server ended the rollout (max turns)
                return None
            if attempt == TRIES - 1:
                log.warning("rollout ends: its turn was answered %s %d times", exc.status_code, TRIES)
                return None
            await asyncio.sleep(_wait_s(exc, attempt))


def _wait_s(exc: APIStatusError, attempt: int) -> float:
    try:
        return min(float(exc.response.headers["retry-after"]), MAX_WAIT_S)
    except (KeyError, ValueError):
        return _backoff_s(attempt)


def _backoff_s(attempt: int) -> float:
    return 0.5 * 2**attempt  # 0.5, 1, 2 s


class InProcessHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, *args, **kwargs):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=shared_http())
        async with AsyncExitStack() as stack:
            servers_cfg = {
                "mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout} for name, url in mcp_urls.items()}
            }
            tools, dispatch, servers = (await connect_mcp(servers_cfg, stack)) if mcp_urls else ([], {}, {})
            while True:
                resp = await complete(client, model=ctx.model, messages=messages, **({"tools": tools} if tools else {}))
                if resp is None:
                    break
                msg = resp.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                if not msg.tool_calls:
                    break
                for call in msg.tool_calls:
                    try:
                        args = json.loads(call.function.arguments or "{}")
                    except json.JSONDecodeError as exc:
                        out = f"error: arguments are not JSON: {exc}"
                    else:
                        out = await call_mcp(servers, dispatch, call.function.name, args)
                    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name, "content": out})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessHarness"]
