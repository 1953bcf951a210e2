"""A verifiers harness whose chat loop runs in this process (harness id ``envs.vf_harness``).

verifiers' stock ``null`` harness runs the loop as a separate program that ``uv`` installs on
first use; this one needs nothing installed at run time. It talks to the endpoint verifiers
gives it (its interception server, which forwards to the gateway and records the trace),
calls the task's MCP tools when the model asks, and stops when the model answers without a
tool call or the server ends the rollout (max turns).
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import verifiers.v1 as vf
from openai import APIStatusError, AsyncOpenAI
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp


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
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            async with AsyncExitStack() as stack:
                servers_cfg = {
                    "mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout} for name, url in mcp_urls.items()}
                }
                tools, dispatch, servers = (await connect_mcp(servers_cfg, stack)) if mcp_urls else ([], {}, {})
                while True:
                    try:
                        resp = await client.chat.completions.create(
                            model=ctx.model, messages=messages, **({"tools": tools} if tools else {})
                        )
                    except APIStatusError:  # the interception server ended the rollout (max turns)
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
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["InProcessHarness"]
