"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the matching status."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi.responses import JSONResponse

# The `type` OpenAI's own API uses for each status; its client maps the status to an exception class.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error the client is answered with; raised anywhere below a route handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    error_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 naming the first offending field, from pydantic/FastAPI's list of errors."""
    first = errors[0]
    # FastAPI prefixes body fields with "body"; the client knows them by their own name.
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return APIError(400, message, param=param, code="invalid_parameter")


def prompt_too_long(num_prompt_tokens: int, max_model_len: int, param: str) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
        f"{num_prompt_tokens} tokens; it must be shorter than {max_model_len} to leave room for output.",
        param=param,
        code="context_length_exceeded",
    )


def model_not_found(requested: str, served: str) -> APIError:
    return APIError(
        404,
        f"The model '{requested}' does not exist; this server serves '{served}'.",
        param="model",
        code="model_not_found",
    )


def invalid_api_key() -> APIError:
    return APIError(
        401, "Missing or incorrect API key (Authorization: Bearer <key>).", code="invalid_api_key"
    )


def queue_full(retry_after_s: int) -> APIError:
    return APIError(
        429,
        f"The server's waiting queue is full; retry in about {retry_after_s} s.",
        code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def queue_timeout(timeout_s: float) -> APIError:
    return APIError(
        503, f"The request waited longer than the queue timeout ({timeout_s:g} s).", code="queue_timeout"
    )


def unavailable(reason: str) -> APIError:
    return APIError(503, reason, code="unavailable")
