"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``, and on the
Messages routes in Anthropic's: ``{"type": "error", "error": {"type", "message"}}``.

Every failure the gateway reports goes through :class:`APIError`, so clients (the ``openai`` and
``anthropic`` SDKs included) always get a 4xx/5xx with a body they can parse, never a bare
traceback. The handlers below give each route's errors its own shape (:func:`in_route_shape`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class APIError(Exception):
    def __init__(
        self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers: dict[str, str] = {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)


# status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
ANTHROPIC_ROUTES = "/v1/messages"  # and /v1/messages/count_tokens


class AnthropicError(APIError):
    """An :class:`APIError` in Anthropic's shape."""

    @classmethod
    def of(cls, err: APIError) -> AnthropicError:
        if isinstance(err, AnthropicError):
            return err
        out = cls(err.status, err.message, type=ANTHROPIC_TYPES.get(err.status, "api_error"), param=err.param, code=err.code)
        out.headers = err.headers
        return out

    def body(self) -> dict:
        return anthropic_error(self.type, self.message)


def anthropic_error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


def in_route_shape(path: str, err: APIError) -> APIError:
    return AnthropicError.of(err) if path.startswith(ANTHROPIC_ROUTES) else err


class CapacityExceeded(APIError):
    """429 ``capacity_exceeded``: a deployment had no room in time. Not the request's fault: the
    forwarder tries the next deployment, and a batch line runs again later."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(429, message, type="rate_limit_error", code="capacity_exceeded")
        self.headers = {"Retry-After": str(retry_after_s)}


class BudgetUncheckable(APIError):
    """503 ``budget_uncheckable``: this replica cannot reach Redis, and may not spend the team's
    budget on its own (it never saw that budget in Redis, so it cannot know what is left; or Redis
    kept failing and answering while the request waited). Nothing was reserved; another replica,
    or a retry, can serve it."""

    def __init__(self, team: str, retry_after_s: float):
        super().__init__(
            503,
            f"the shared state that keeps team {team!r}'s budget is unreachable from this gateway; retry shortly, "
            "or send to another gateway",
            type="server_error",
            code="budget_uncheckable",
        )
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}


class TraceStoreBehind(APIError):
    """503 ``trace_store_behind``: this gateway's traces wait in its spool faster than they reach
    Parquet, past ``trace_spool_limit_mb``. New requests wait (a batch line runs again later)
    rather than the spool filling the disk; those already accepted finish and are stored."""

    def __init__(self, backlog_mb: float, limit_mb: int):
        super().__init__(
            503,
            f"this gateway's trace spool holds {backlog_mb:.0f} MB not yet converted to Parquet (limit "
            f"{limit_mb} MB); retry shortly, or send to another gateway",
            type="server_error",
            code="trace_store_behind",
        )
        self.headers = {"Retry-After": "1"}


def model_not_found(model: str) -> APIError:
    return APIError(
        404, f"The model `{model}` does not exist or you do not have access to it.", param="model", code="model_not_found"
    )


def invalid_request(errors: list[dict]) -> APIError:
    """A 400 naming the first problem pydantic found (in a request body or a model)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return APIError(
            400, f"We could not parse the JSON body of your request. ({first.get('ctx', {}).get('error', 'invalid JSON')})"
        )
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body" and not _union_tag(p)) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = f"Missing required parameter: '{param}'."
    elif param:
        msg = f"Invalid value for '{param}': {msg}"
    return APIError(400, msg, param=param)


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "null"}


def _union_tag(part) -> bool:
    """pydantic names the union member it tried in the error location ('stop.list[str].0'):
    a client's parameter name never has one."""
    return isinstance(part, str) and ("[" in part or part.lower() in _TYPE_NAMES)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return in_route_shape(request.url.path, exc).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return in_route_shape(request.url.path, invalid_request(exc.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return in_route_shape(request.url.path, APIError(exc.status_code, str(exc.detail), type=kind)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        err = APIError(500, f"Internal error in the gateway: {type(exc).__name__}: {exc}", type="server_error")
        return in_route_shape(request.url.path, err).response()
