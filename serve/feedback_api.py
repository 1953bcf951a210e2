"""`POST /v1/feedback`: rewards, scores, labels and comments for traces, one or a batch.

Feedback is stored under the caller's team and only joins to that team's traces (the admin key
may rate any trace). It is durable when the 200 comes back. A trace id that is not queryable
yet (its record may still be on its way from the spool to Parquet) is accepted: the join
happens at query time.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, ValidationError, model_validator

from serve.errors import invalid_request
from serve.gateway_parts import GatewayParts, parts
from serve.json_codec import request_object
from serve.openapi import json_body
from traces.feedback import write_feedback

MAX_BATCH = 10_000


class FeedbackItem(BaseModel):
    trace_id: str = Field(min_length=1)
    name: str = Field("reward", min_length=1, max_length=128, description="which reward this is")
    reward: float | None = Field(None, allow_inf_nan=False)  # NaN is no reward, and no JSON either
    score: float | None = Field(None, allow_inf_nan=False)
    label: str | None = Field(None, max_length=1024)
    comment: str | None = Field(None, max_length=65536)
    source: str = "api"

    @model_validator(mode="after")
    def _says_something(self):
        if self.reward is None and self.score is None and self.label is None and self.comment is None:
            raise ValueError("give at least one of reward, score, label, comment")
        return self


class FeedbackBatch(BaseModel):
    feedback: list[FeedbackItem] = Field(min_length=1, max_length=MAX_BATCH)


def save_feedback(traces_dir: str, caller, items: list[FeedbackItem]) -> list[str]:
    """Store feedback as ``caller``'s team (the API and the trace browser both come here)."""
    return write_feedback(traces_dir, [{**i.model_dump(), "team": caller.team, "api_key_id": caller.key_id} for i in items])


router = APIRouter()


@router.post("/v1/feedback", openapi_extra=json_body(FeedbackItem, FeedbackBatch))
async def post_feedback(request: Request, gw: GatewayParts = Depends(parts)):
    caller = gw.caller(request)
    body, _ = request_object(await request.body())
    try:  # a batch is an object whose key is "feedback"; anything else is one item
        items = FeedbackBatch.model_validate(body).feedback if "feedback" in body else [FeedbackItem.model_validate(body)]
    except ValidationError as exc:
        raise invalid_request(exc.errors()) from None
    ids = await run_in_threadpool(save_feedback, gw.config.traces_dir, caller, items)
    return {"object": "list", "data": [{"id": fid, "trace_id": i.trace_id} for fid, i in zip(ids, items)]}
