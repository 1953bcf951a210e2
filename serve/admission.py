"""Lease-based admission control and per-team budgets.

A request holds a lease on its deployment (one request slot plus its worst-case tokens) for
as long as it runs: renewed every third of the TTL while it streams, released when it ends.
A replica that dies stops renewing, so its capacity returns within the TTL. When a deployment
is full the request waits in a bounded queue, then gets a 429 with ``Retry-After``.

Budgets work the same way on a team's ledger: admission reserves the request's worst-case cost
(prompt upper bound + ``max_tokens``, in tokens and in money at the model's prices) and the
completion settles it at the real usage, so concurrent requests can never spend past the limit.

Batch lines (the Batch API) are a lower priority class: they never wait in the queue (a full
deployment sends them back to the batch scheduler to try later), are refused while an
interactive request waits for that deployment, hold at most ``batch.share`` of its request
slots (a second ledger), start fewer at a time while interactive requests for their model are
being served (:mod:`serve.batch.lanes`), and cost ``batch_discount`` less.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass

from serve import json_codec
from serve.batch.lanes import InteractiveSignal
from serve.config import GatewayConfig, Price, TeamLimits
from serve.errors import APIError, BudgetUncheckable, CapacityExceeded
from serve.ledger import CutOff, Ledger, Reservation, Want, reserve_together, settle_together
from serve.rate_window import RateWindow, WindowCheck
from serve.shared_state import SharedState

NO_LIMIT = -1
RATE_WINDOW_S = 60.0  # rpm and tpm count what was admitted in the last minute
OVERFLOW = "+overflow"  # a dedicated deployment's requests spilled to serverless, in the lease ledger


def _rid(kind: str) -> str:
    """A reservation's id: 128 random bits, as uuid4's, without building a UUID per request."""
    return kind + os.urandom(16).hex()


def micro_usd(prompt: int, completion: int, price: Price | None, cached: int = 0) -> int:
    """The cost in micro-dollars, rounded up: a price per 1M tokens times tokens; ``cached`` of
    the prompt tokens at the cached-input price."""
    if price is None:
        return 0
    cached = min(cached, prompt)
    return math.ceil((prompt - cached) * price.input_per_mtok + cached * price.cached + completion * price.output_per_mtok - 1e-9)


def worst_case_tokens(body: dict, prompt_json: bytes | None = None) -> tuple[int, int]:
    """(prompt upper bound, completion maximum). A byte-level BPE token covers at least one
    byte, so the prompt's UTF-8 size plus a margin per message for the chat template bounds its
    token count without tokenizing. ``prompt_json``: the prompt's JSON as the client sent it (no
    shorter than ours: it is measured instead of writing a long prompt out)."""
    prompt = body.get("messages") if "messages" in body else body.get("prompt", body.get("token_ids"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        prompt_tokens = len(prompt)
    else:
        n_messages = len(prompt) if isinstance(prompt, list) else 1
        size = len(prompt_json) if prompt_json is not None else len(json_codec.encode(prompt))
        prompt_tokens = size + 16 * n_messages
        if body.get("tools"):
            prompt_tokens += len(json_codec.encode(body["tools"]))
    sp = body.get("sampling_params") or {}
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or sp.get("max_tokens") or 1024
    return prompt_tokens, int(completion)


@dataclass
class Admitted:
    lease: Reservation | None
    budget: Reservation | None
    prompt_tokens: int = 0  # the worst cases the reservations were made for
    completion_tokens: int = 0
    batch_lease: Reservation | None = None
    running: Reservation | None = None  # the team's slot under gateway.limits.<team>.max_concurrent
    discount: float = 0.0  # off the price: a batch line's
    demand: Reservation | None = None  # spilled from a dedicated deployment: counted in its demand

    @property
    def reserved(self) -> bool:
        return self.lease is not None or self.budget is not None


class Admission:
    def __init__(self, config: GatewayConfig, state: SharedState):
        self.config, self.state = config, state
        a = config.admission
        self.leases = Ledger(state, "fw:lease", a.lease_ttl_s)
        self.batch_leases = Ledger(state, "fw:batch-lease", a.lease_ttl_s)
        self.budgets = Ledger(state, "fw:budget", a.lease_ttl_s, persist=config.spend_file, guarded=True)
        self.rates = RateWindow(state, "fw:rate", RATE_WINDOW_S)
        self.running = Ledger(state, "fw:running", a.lease_ttl_s)
        # a team's dedicated replica time (a: replica-milliseconds, b: micro-USD), also in its budget
        dedicated_file = f"{config.spend_file}.dedicated" if config.spend_file else None
        self.dedicated = Ledger(state, "fw:dedicated", a.lease_ttl_s, persist=dedicated_file)
        self._waiting: dict[str, int] = {}
        self.interactive = InteractiveSignal(state, config.batch.interactive_hold_s)

    def look(self) -> None:
        """Refresh what each ledger last saw of the shared state (see :meth:`Ledger.look`)."""
        for ledger in (self.leases, self.batch_leases, self.budgets, self.running, self.dedicated):
            ledger.look()

    async def admit(
        self,
        deployment: str,
        team: str,
        model: str,
        body: dict,
        batch: bool = False,
        worst: tuple[int, int] | None = None,
        demand_of: str | None = None,
        charged: bool = True,
    ) -> Admitted:
        """``worst``: :func:`worst_case_tokens` of ``body``, when the caller has it already.
        ``demand_of``: the dedicated deployment that spilled this request to ``deployment``; it
        is counted in that one's demand (:meth:`spilled`) while it runs, so its autoscaler sees it.
        ``charged`` False: the platform's own copy (a shadow arm's): a lease on the deployment, nothing on the team."""
        waited = 0.0
        while True:
            try:
                admitted = await self._admit(deployment, team, model, body, batch, worst, charged)
                break
            except CutOff as cut:  # this replica lost Redis: the team's budget is not yet its to spend alone
                if cut.wait_s is None or waited + cut.wait_s > 2 * self.state.alone_after_s:
                    raise BudgetUncheckable(team, self.state.retry_s) from None
                await asyncio.sleep(cut.wait_s)  # Redis is tried again meanwhile (retry_s)
                waited += cut.wait_s
        if demand_of is not None:
            admitted.demand = self.leases.reserve(demand_of + OVERFLOW, _rid("d-"), 0, 0, (NO_LIMIT, NO_LIMIT, NO_LIMIT))
        return admitted

    def spilled(self, deployment: str) -> int:
        """Requests of dedicated ``deployment`` running on serverless now."""
        return self.leases.totals(deployment + OVERFLOW).live

    async def _admit(
        self, deployment: str, team: str, model: str, body: dict, batch: bool, worst: tuple[int, int] | None, charged: bool
    ) -> Admitted:
        prompt, completion = worst or worst_case_tokens(body)
        price = self.config.prices.get(model)
        discount = price.batch_discount if (batch and price) else 0.0
        budget_want = self._budget_want(team, price, prompt, completion, discount) if charged else None
        running_want = None if batch or not charged else self._running_want(team)
        if not batch:
            self.interactive.seen(model)  # batch lines make room (serve/batch/lanes.py)
            lease_want = self._lease_want(deployment, prompt + completion)
            wants = [w for w in (budget_want, running_want, lease_want) if w is not None]
            got = reserve_together(wants)  # the usual case: budget and a free slot, one round trip
            if not isinstance(got, int):
                held = dict(zip(map(id, wants), got))
                return Admitted(
                    held.get(id(lease_want)), held.get(id(budget_want)), prompt, completion, running=held.get(id(running_want))
                )
            if wants[got] is not lease_want:  # a full deployment queues; a team's own limit does not
                raise self._team_refusal(team, wants[got], budget_want)
        budget, running = self._reserve_team(team, budget_want, running_want)  # then wait in the queue for a slot
        batch_lease = lease = None
        try:
            if batch:
                batch_lease = self._batch_lease(deployment, prompt + completion)
                lease = self._lease_now(deployment, prompt + completion)
                if lease is None and self.config.capacity.get(deployment) is not None:
                    raise self._full(deployment, "no free slot for a batch line")
            else:
                lease = await self._lease(deployment, prompt + completion)
        except BaseException:
            for res, ledger in ((budget, self.budgets), (batch_lease, self.batch_leases), (running, self.running)):
                if res is not None:
                    ledger.settle(res)
            raise
        return Admitted(lease, budget, prompt, completion, batch_lease, running=running, discount=discount)

    def rate_limit(self, team: str, worst: tuple[int, int]) -> dict[str, str]:
        """Count one request and its tokens (prompt + completion maximum) against the team's
        ``rpm`` and ``tpm``: the headers OpenAI sends, or 429 ``rate_limit_exceeded`` with a
        ``Retry-After``. Once per request, before any deployment is tried."""
        limits = self.config.limits.get(team)
        if limits is None or (limits.rpm is None and limits.tpm is None):
            return {}
        tokens = sum(worst)
        check = self.rates.admit(team, tokens, limits.rpm, limits.tpm)
        headers = self._rate_headers(limits, check)
        if check.admitted:
            return headers
        wait = max(1, math.ceil(check.wait_s))
        if limits.rpm is not None and check.requests >= limits.rpm:
            kind, what = "requests", f"requests per min (RPM): Limit {limits.rpm}, Used {check.requests}, Requested 1"
        else:
            kind, what = "tokens", f"tokens per min (TPM): Limit {limits.tpm}, Used {check.tokens}, Requested {tokens}"
        err = APIError(
            429,
            f"Rate limit reached for team {team!r} on {what}. Please try again in {wait}s.",
            type=kind,
            code="rate_limit_exceeded",
        )
        err.headers = {"Retry-After": str(wait), **headers}
        raise err

    @staticmethod
    def _rate_headers(limits: TeamLimits, check: WindowCheck) -> dict[str, str]:
        # the newest request is in the window, so all of it is free again a window later
        headers = {}
        if limits.rpm is not None:
            headers |= {
                "x-ratelimit-limit-requests": str(limits.rpm),
                "x-ratelimit-remaining-requests": str(max(0, limits.rpm - check.requests)),
                "x-ratelimit-reset-requests": f"{RATE_WINDOW_S:g}s",
            }
        if limits.tpm is not None:
            headers |= {
                "x-ratelimit-limit-tokens": str(limits.tpm),
                "x-ratelimit-remaining-tokens": str(max(0, limits.tpm - check.tokens)),
                "x-ratelimit-reset-tokens": f"{RATE_WINDOW_S:g}s",
            }
        return headers

    def _running_want(self, team: str) -> Want | None:
        limits = self.config.limits.get(team)
        if limits is None or limits.max_concurrent is None:
            return None
        return Want(self.running, team, _rid("c-"), 0, 0, (limits.max_concurrent, NO_LIMIT, NO_LIMIT))

    def _reserve_team(self, team: str, budget_want: Want | None, running_want: Want | None):
        """The team's budget and running slot, both or neither (a request queued for a slot holds them)."""
        wants = [w for w in (budget_want, running_want) if w is not None]
        got = reserve_together(wants)
        if isinstance(got, int):
            raise self._team_refusal(team, wants[got], budget_want)
        held = dict(zip(map(id, wants), got))
        return held.get(id(budget_want)), held.get(id(running_want))

    def _team_refusal(self, team: str, refused: Want, budget_want: Want | None) -> APIError:
        """The 429 for the team's want that did not fit: its budget, or its running slots."""
        return self._no_budget(team, refused.a, refused.b) if refused is budget_want else self._too_many_running(team)

    def _too_many_running(self, team: str) -> APIError:
        limit = self.config.limits[team].max_concurrent
        err = APIError(
            429,
            f"team {team!r} has {limit} request(s) in flight, its limit "
            "(gateway.limits.<team>.max_concurrent); retry when one finishes",
            type="requests",
            code="rate_limit_exceeded",
        )
        err.headers = {"Retry-After": "1"}
        return err

    def _batch_lease(self, deployment: str, tokens: int) -> Reservation | None:
        """A batch line's slot in the batch share; none while an interactive request waits."""
        cap = self.config.capacity.get(deployment)
        if cap is None:
            return None
        if self._waiting.get(deployment, 0):
            raise self._full(deployment, "interactive requests are waiting")
        share = max(1, int(cap.max_requests * self.config.batch.share))
        res = self.batch_leases.reserve(deployment, _rid("bl-"), tokens, 0, (share, NO_LIMIT, NO_LIMIT))
        if res is None:
            raise self._full(deployment, f"batch lines hold their share ({share} slots)")
        return res

    def _lease_want(self, deployment: str, tokens: int) -> Want | None:
        cap = self.config.capacity.get(deployment)
        if cap is None:
            return None
        return Want(self.leases, deployment, _rid("l-"), tokens, 0, (cap.max_requests, cap.max_tokens, NO_LIMIT))

    def _lease_now(self, deployment: str, tokens: int) -> Reservation | None:
        want = self._lease_want(deployment, tokens)
        return None if want is None else self.leases.reserve(want.name, want.rid, want.a, want.b, want.limits)

    def _budget_want(self, team: str, price: Price | None, prompt: int, completion: int, discount: float = 0.0) -> Want | None:
        limit = self.config.budgets.get(team)
        if limit is None:
            return None
        # the worst case: no prompt token cached (unless cheaper)
        cost_micro = max(micro_usd(prompt, completion, price), micro_usd(prompt, completion, price, prompt))
        cost_micro = math.ceil(cost_micro * (1 - discount))
        return Want(
            self.budgets,
            limit.ledger(team),
            _rid("b-"),
            prompt + completion,
            cost_micro,
            (
                NO_LIMIT,
                limit.tokens if limit.tokens is not None else NO_LIMIT,
                limit.usd * 1e6 if limit.usd is not None else NO_LIMIT,
            ),
        )

    @staticmethod
    def _no_budget(team: str, tokens: int, cost_micro: int) -> APIError:
        return APIError(
            429,
            f"team {team!r} has not enough budget left for this request "
            f"(worst case {tokens} tokens, ${cost_micro / 1e6:.6f}); see GET /v1/usage",
            type="insufficient_quota",
            code="insufficient_quota",
        )

    async def _lease(self, deployment: str, tokens: int) -> Reservation | None:
        res = self._lease_now(deployment, tokens)
        if res is not None or self.config.capacity.get(deployment) is None:
            return res
        a = self.config.admission
        if self._waiting.get(deployment, 0) >= a.queue_limit:
            raise self._full(deployment, "its queue is full")
        self._waiting[deployment] = self._waiting.get(deployment, 0) + 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + a.max_queue_wait_s
            delay = 0.01
            while loop.time() < deadline:
                await asyncio.sleep(delay)
                res = self._lease_now(deployment, tokens)
                if res is not None:
                    return res
                delay = min(delay * 2, 0.2)
        finally:
            self._waiting[deployment] -= 1
        raise self._full(deployment, f"no capacity freed within {a.max_queue_wait_s:g} s")

    def _full(self, deployment: str, why: str) -> CapacityExceeded:
        return CapacityExceeded(
            f"deployment {deployment!r} is at capacity ({why}); retry later",
            retry_after_s=max(1, math.ceil(self.config.admission.lease_ttl_s / 3)),
        )

    def renew(self, admitted: Admitted) -> None:
        for res, ledger in (
            (admitted.lease, self.leases),
            (admitted.budget, self.budgets),
            (admitted.batch_lease, self.batch_leases),
            (admitted.running, self.running),
            (admitted.demand, self.leases),
        ):
            if res is not None:
                ledger.renew(res)

    def release(self, admitted: Admitted, model: str, usage: dict | None, produced: int = 0) -> None:
        """End the lease; settle the budget at the real usage. A request that ended before its
        usage was reported (a stream cut short) is charged its reserved prompt and the
        ``produced`` completion tokens; one that produced nothing, nothing. Idempotent: a second
        call (an error path after the request was settled) changes nothing."""
        lease, res, batch_lease, running = admitted.lease, admitted.budget, admitted.batch_lease, admitted.running
        demand = admitted.demand
        admitted.lease = admitted.budget = admitted.batch_lease = admitted.running = admitted.demand = None
        held = ((self.leases, lease), (self.batch_leases, batch_lease), (self.running, running), (self.leases, demand))
        settles = [(ledger, r, 0, 0) for ledger, r in held if r is not None]
        if res is not None:
            cached = 0
            if usage:
                tin, tout = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            elif produced:
                tin, tout = admitted.prompt_tokens, produced
            else:
                tin = tout = 0
            cost = micro_usd(tin, tout, self.config.prices.get(model), cached)
            settles.append((self.budgets, res, tin + tout, math.ceil(cost * (1 - admitted.discount))))
        settle_together(settles)  # one round trip for all of them

    def charge_replica_time(self, team: str, replica_ms: int, cost_micro: int) -> bool:
        """Charge a dedicated deployment's replica time to ``team``; False once its budget is spent."""
        limit = self.config.budgets.get(team)
        name = limit.ledger(team) if limit else team
        nothing_held = Reservation(name, "charge", 0, 0, shared=bool(self.state.redis_url))
        settle_together([(self.budgets, nothing_held, 0, cost_micro), (self.dedicated, nothing_held, replica_ms, cost_micro)])
        if limit is None or limit.usd is None:
            return True
        return self.budgets.totals(name).spent_b < limit.usd * 1e6

    def usage(self, team: str) -> dict:
        limit = self.config.budgets.get(team)
        name = limit.ledger(team) if limit else team
        t, d = self.budgets.totals(name), self.dedicated.totals(name)
        return {
            "team": team,
            "spent_tokens": int(t.spent_a),
            "spent_usd": round(t.spent_b / 1e6, 6),
            "serverless_usd": round((t.spent_b - d.spent_b) / 1e6, 6),
            "dedicated": {"replica_hours": round(d.spent_a / 3.6e6, 6), "usd": round(d.spent_b / 1e6, 6)},
            "reserved_tokens": int(t.reserved_a),
            "in_flight": t.live,
            "limit_tokens": limit.tokens if limit else None,
            "limit_usd": limit.usd if limit else None,
            "period": limit.period if limit else None,
        }

    def leases_held(self, deployment: str) -> tuple[int, int]:
        t = self.leases.totals(deployment)
        return t.live, int(t.reserved_a)
