"""One request's way through the gateway, as a pipeline of stages, each in its own module:

    authenticate (serve/auth.py) -> admit (serve/admission.py) -> choose a deployment
    (serve/choose.py) -> rewrite (serve/upstream.py) -> send (serve/send.py) -> relay through
    capture, tools and the client's view (serve/relay.py) -> settle (serve/settle.py)

Each try at a deployment is one :class:`serve.attempt.Attempt` and ends in one
:class:`serve.outcome.Outcome`, which the breaker, ``/metrics``, the ledgers and the trace all
read. A connect error, 5xx or timeout before the first token fails over to the next deployment;
after the first token a failure ends the stream with an OpenAI-style error event. The trace is
durable before the response finishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, replace

from serve.admission import Admission, worst_case_tokens
from serve.affinity import Affinity
from serve.attempt import Attempt, AttemptFailed
from serve.breaker import Breakers
from serve.capture import Capture, RequestContext
from serve.choose import Chooser
from serve.config import GatewayConfig, ModelRoute
from serve.context_limit import check_counts, check_text, might_overflow
from serve.deployments import Deployments
from serve.errors import APIError, CapacityExceeded, TraceStoreBehind, model_not_found
from serve.metrics import Metrics
from serve.outcome import Outcome
from serve.reload_gate import ReloadGate
from serve.relay import read_unary, relay
from serve.send import send
from serve.settle import Settler
from serve.split import choose_arm, shadow_arms
from serve.team_turns import TeamTurns
from serve.tools.definitions import Bounds, ToolLimits, checked_key, is_checked, parse_tools
from serve.tools.grammar import grammar_for
from serve.upstream import Rewrite
from serve.upstream_pool import UpstreamPool
from serve.wake import until_awake
from traces.writer import TraceWriter
from traces.ids import new_trace_id

log = logging.getLogger(__name__)
MAX_SHADOWS = 64  # shadow copies in flight per gateway replica


@dataclass
class Stream:
    """A streamed answer: its headers, and the SSE bytes to send as they come."""

    headers: dict[str, str]
    body: AsyncIterator[bytes]


class Forwarder:
    def __init__(
        self,
        config: GatewayConfig,
        routes: MutableMapping[str, ModelRoute],
        writer: TraceWriter,
        admission: Admission,
        breakers: Breakers,
        affinity: Affinity,
        metrics: Metrics,
        deployments: Deployments | None = None,
    ):
        self.config, self.routes, self.admission, self.metrics = config, routes, admission, metrics
        self.writer = writer
        self.deployments = deployments  # dedicated ones: a request for one scaled to zero wakes it
        self.reload_gate = ReloadGate()  # serve/weights.py closes it while it reloads a deployment
        self.chooser = Chooser(breakers, affinity)
        self.settler = Settler(writer, admission, breakers, metrics, config.admission.lease_ttl_s / 3)
        self.bounds = Bounds(config.tools.max_string_length, config.tools.max_array_items)
        self.tool_limits = ToolLimits(config.tools.max_tools, config.tools.max_tools_bytes, config.tools.max_schema_depth)
        self.pool = UpstreamPool(read_timeout=config.upstream_timeout_s)
        self.turns = TeamTurns(share=config.refused_work_share)
        self.shadows: set[asyncio.Task] = set()  # shadow arms' copies running (held: a bare task may be collected)

    async def forward(self, operation: str, body: dict, ctx: RequestContext):
        """Returns the client's view (a dict, or a :class:`Stream`) and the headers to send."""
        backlog, limit_mb = self.writer.backlog_bytes(), self.config.trace_spool_limit_mb
        if backlog > limit_mb << 20:  # refused before any work: nothing to store, nothing lost
            self.metrics.rejected(body.get("model", ""), ctx.team, 503)
            raise TraceStoreBehind(backlog / (1 << 20), limit_mb)
        if ctx.shadow_route is not None:  # a shadow arm's copy (serve/split.py): answered to no one
            alias_route = route = ctx.shadow_route
        else:
            alias_route = self.routes.get(body["model"])
            if alias_route is None or not alias_route.serves(ctx.team, ctx.admin):  # another team's does not exist here
                raise model_not_found(body["model"])
            route = self._arm(alias_route, ctx)
        route, spilled_from = self._overflow(route, ctx)
        dep = self.config.deployment(route.deployment)
        check_counts(body, dep.max_model_len)
        worst = worst_case_tokens(body, ctx.prompt_json)  # once: it measures the whole prompt
        if might_overflow(body, dep.max_model_len, worst):
            await self.turns.run(ctx.team, check_text, body, dep.max_model_len, dep.model_path)
        tool_req = await self._tools(body, ctx.team) if operation == "chat" else None
        if tool_req is not None and body.get("guided_grammar"):
            raise APIError(400, "guided_grammar cannot be combined with tools", param="guided_grammar")
        capture = Capture(ctx)
        # compiling a grammar can take a while for a large schema: not on the event loop
        grammar = await self.turns.run(ctx.team, grammar_for, tool_req, self.config.tools.layout) if tool_req else None
        rewrite = Rewrite(body, operation, route.upstream_model, grammar, ctx.prompt_json, ctx.team, admin=ctx.admin)
        headers = {"X-Trace-ID": ctx.trace_id}
        if ctx.batch_id is None and ctx.shadow_route is None:  # batch lines have their own lane (serve/batch/lanes.py)
            try:
                headers.update(self.admission.rate_limit(ctx.team, worst))
            except APIError as err:
                await self._refused(ctx, capture, err)
                raise
            self._copy_to_shadows(operation, body, ctx, alias_route)
        last_error = APIError(503, f"no healthy deployment serves {ctx.alias!r} (all circuit breakers open)", type="server_error")
        last_outcome = Outcome.REJECTED
        # a shadow copy leaves the session's pinned deployment alone
        for dep_name in self.chooser.order(route, None if ctx.shadow_route else ctx.scoped_session):
            if not self.chooser.allow(dep_name):
                continue
            t_wait = time.monotonic()
            try:
                admitted = await self.admission.admit(
                    dep_name,
                    ctx.team,
                    ctx.price_model,
                    body,
                    batch=ctx.batch_id is not None,
                    worst=worst,
                    demand_of=spilled_from,
                    charged=ctx.shadow_route is None,  # the platform's copy, not the team's request
                )
            except CapacityExceeded as err:  # full: the next deployment may have room
                last_error, last_outcome = err, Outcome.REJECTED
                continue
            except APIError as err:
                await self._refused(ctx, capture, err)
                raise
            self.metrics.admission_wait.observe(time.monotonic() - t_wait)
            if admitted.reserved and not (body.get("max_tokens") or body.get("max_completion_tokens")):
                # the reservation assumed this many: the engine must not produce more
                rewrite.upstream_body["max_tokens"] = admitted.completion_tokens
            ctx.deployment = dep_name
            headers["X-Deployment"] = dep_name
            attempt = Attempt(self.config.deployment(dep_name), operation, rewrite, capture, admitted, tool_req)
            try:
                if self.deployments is not None:
                    await self._awake(attempt, dep_name)
                capture.mark_admitted()
                return await self._attempt(attempt), headers
            except AttemptFailed as failed:
                self.settler.outcome(dep_name, failed.outcome)
                self.settler.release(attempt, None)
                if not failed.retryable:
                    err = failed.error
                    await self.settler.durable(capture.record(err.status, err.message, failed.outcome))
                    raise err from None
                last_error, last_outcome = failed.error, failed.outcome
                log.warning("deployment %s failed before the first token (%s); trying the next", dep_name, failed.error.message)
            except BaseException:
                self.settler.release(attempt, None)
                raise
        if ctx.batch_id is not None and isinstance(last_error, CapacityExceeded):
            raise last_error  # not an answer: the batch scheduler runs the line again later
        if last_outcome is Outcome.REJECTED:
            self.metrics.outcome("", last_outcome.value)
        await self.settler.durable(capture.record(last_error.status, last_error.message, last_outcome))
        self.metrics.rejected(ctx.alias, ctx.team, last_error.status)
        raise last_error

    @staticmethod
    def _arm(route: ModelRoute, ctx: RequestContext) -> ModelRoute:
        """The arm of a split alias the request takes, sticky per session (serve/split.py);
        its trace records which."""
        chosen, ctx.arm = choose_arm(route, ctx.scoped_session or ctx.trace_id)
        if ctx.arm is not None:
            ctx.take(chosen)
        return chosen

    def _copy_to_shadows(self, operation: str, body: dict, ctx: RequestContext, route: ModelRoute) -> None:
        """Send a copy of the request to each shadow arm it falls to, unary, in the background:
        its answer is traced (its own trace id, the arm's name) and dropped. At most
        ``MAX_SHADOWS`` copies run at once; beyond that one is skipped, never waited for."""
        for arm in shadow_arms(route, ctx.scoped_session or ctx.trace_id):
            if len(self.shadows) >= MAX_SHADOWS:
                self.metrics.shadow_skipped.inc()
                continue
            unary = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
            copy = replace(ctx, body=unary, trace_id=new_trace_id(), arm=arm.name, shadow_route=arm.route)
            copy.deployment = arm.route.deployment
            copy.take(arm.route)
            task = asyncio.get_running_loop().create_task(self._shadow(operation, unary, copy))
            self.shadows.add(task)
            task.add_done_callback(self.shadows.discard)

    async def _shadow(self, operation: str, body: dict, ctx: RequestContext) -> None:
        try:
            await self.forward(operation, body, ctx)
        except APIError:
            pass  # refused or failed: its trace says so
        except Exception:  # a bug here must not reach the client's request: it is already answered
            log.exception("shadow copy %s to %s failed", ctx.trace_id, ctx.arm)

    def _overflow(self, route: ModelRoute, ctx: RequestContext) -> tuple[ModelRoute, str | None]:
        """The route to take, and the dedicated deployment it spilled from (None: it did not).
        A dedicated deployment with overflow on that cannot take more spills the request to the
        serverless deployment of its base model (serve/deployments.py), charged per token there;
        the trace's deployment says which served. Not batch lines: they wait their turn."""
        if self.deployments is None or ctx.batch_id is not None:
            return route, None
        to = self.deployments.spill_to(route.deployment)
        serverless = self.routes.get(to) if to else None
        if serverless is None:
            return route, None
        self.metrics.spilled(route.deployment)
        ctx.priced_as = to
        ctx.take(serverless)
        return serverless, route.deployment

    async def _awake(self, attempt: Attempt, dep_name: str) -> None:
        """Hold the request while its deployment wakes from zero (serve/wake.py)."""
        self.settler.keep_alive(attempt)  # a start (~40 s for vLLM-CPU) outlasts the lease's TTL
        try:
            await until_awake(self.deployments, dep_name, attempt.ctx.alias)
        except APIError as err:  # released and traced as the deployment's own refusal
            raise AttemptFailed(err, Outcome.REJECTED, retryable=False) from None

    async def _refused(self, ctx: RequestContext, capture: Capture, err: APIError) -> None:
        """A request the gateway refused before any deployment saw it: counted and traced."""
        self.metrics.rejected(ctx.alias, ctx.team, err.status)
        self.metrics.outcome("", Outcome.REJECTED.value)
        await self.settler.durable(capture.record(err.status, err.message, Outcome.REJECTED))

    async def _tools(self, body: dict, team: str | None):
        """The request's tools, checked: tools already seen on the loop, new ones (~4 ms a
        schema) in a thread, so a request of many new schemas cannot stall other requests."""
        key = checked_key(body, self.bounds, self.tool_limits)  # the cheap bounds, once
        if is_checked(key):
            return parse_tools(body, self.bounds, self.tool_limits, key)
        return await self.turns.run(team, parse_tools, body, self.bounds, self.tool_limits, key)

    async def _send_past_reloads(self, attempt: Attempt, dep: str):
        """``send`` once the deployment is not being reloaded (serve/reload_gate.py); a failure
        before the first token after a reload or pause began is sent again once it has ended:
        the paused engine refused it unstarted (Dynamo does so to an adapter's request, a 500)."""
        await self.reload_gate.passage(dep)
        passed = self.reload_gate.begun(dep)
        try:
            return await send(self.pool, attempt, self.config.first_token_timeout_s)
        except AttemptFailed as failed:
            if not failed.retryable or self.reload_gate.begun(dep) == passed:
                raise
        await self.reload_gate.passage(dep)
        return await send(self.pool, attempt, self.config.first_token_timeout_s)

    async def _attempt(self, attempt: Attempt) -> dict | Stream:
        """Send, then relay a stream or read a unary answer; the answer is delivered only once
        its trace is durable."""
        dep, capture, ctx = attempt.deployment.name, attempt.capture, attempt.ctx
        self.settler.keep_alive(attempt)  # a unary answer may take longer than the lease's TTL
        upstream = await self._send_past_reloads(attempt, dep)
        self.metrics.upstream_first_byte(dep, time.monotonic() - capture.sent_mono)
        if attempt.stream:
            self.settler.stop_renewing(attempt)  # the relay renews from its own start (serve/relay.py)
            return Stream({"X-Trace-ID": ctx.trace_id, "X-Deployment": dep}, relay(attempt, upstream, self.settler))
        data = await read_unary(attempt, upstream)
        self.settler.first_token(dep, capture)
        self.settler.release(attempt, data.get("usage"))  # the engine did the work
        try:
            await self.settler.acknowledge(capture.record(200, outcome=Outcome.OK))
        except APIError:
            self.settler.outcome(dep, Outcome.NOT_DURABLE)
            raise
        self.settler.outcome(dep, Outcome.OK)
        self.metrics.served(ctx.alias, ctx.team, data.get("usage"))
        return attempt.rewrite.client_view(data, ctx.alias)
