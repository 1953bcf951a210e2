"""Waking a deployment scaled to zero. The request that finds it asleep is held at the gateway
(the only place that still sees its demand), one replica is asked for (within the pool), and the
request goes on once a replica is ready; after the deployment's ``cold_start_timeout_s`` it gets
503 ``deployment_starting`` with ``Retry-After``. The forwarder marks the request admitted only
after, so the wait is in its trace's ``queue_wait_ms``.
"""

from __future__ import annotations

import asyncio
import time

from serve.deployments import ROUTABLE, Deployments
from serve.errors import APIError, model_not_found

WAKE_POLL_S = 0.2
RETRY_AFTER_S = 10


async def until_awake(deployments: Deployments, dep_id: str, alias: str) -> None:
    dep = deployments.asleep(dep_id)
    if dep is None:
        return
    deadline = time.monotonic() + dep.autoscale.cold_start_timeout_s
    while True:
        dep = await asyncio.to_thread(deployments.wake, dep_id)
        if dep is None or dep.status not in ROUTABLE:  # deleted or stopped meanwhile
            raise model_not_found(alias)
        if dep.replicas.ready > 0:
            return
        if time.monotonic() > deadline:
            waits = next((d.reason for d in reversed(dep.decisions) if not d.applied), None)
            err = APIError(
                503,
                f"{alias} is starting from zero replicas and was not ready within "
                f"{dep.autoscale.cold_start_timeout_s:.0f} s{f' ({waits})' if waits else ''}; retry",
                type="server_error",
                code="deployment_starting",
            )
            err.headers = {"Retry-After": str(RETRY_AFTER_S)}
            raise err
        await asyncio.sleep(WAKE_POLL_S)
