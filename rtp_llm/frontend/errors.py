"""HTTP errors as JSON bodies: upstream's {error_code, error_code_str, message} on the native
routes, OpenAI's {"error": {...}} on /v1."""

import json
from enum import IntEnum
from typing import Optional

from aiohttp import web


class ErrorCode(IntEnum):
    """Upstream RTP-LLM's ExceptionType / ErrorCode numbers (the engine's are in
    rtp_llm/cpp/engine/error_code.h); clients switch on them."""

    ERROR_INPUT_FORMAT_ERROR = 507
    LONG_PROMPT_ERROR = 511
    CONCURRENCY_LIMIT_ERROR = 513
    UNKNOWN_ERROR = 514
    GENERATE_TIMEOUT = 603
    INVALID_PARAMS = 605
    EXECUTION_EXCEPTION = 606
    EXCEEDS_KV_CACHE_MAX_LEN = 607
    CANCELLED = 8100


def code_name(error_code: int) -> Optional[str]:
    try:
        return ErrorCode(error_code).name
    except ValueError:
        return None


class RequestError(Exception):
    """Bad input: 400 naming the field."""

    def __init__(self, field: str, message: str, status: int = 400,
                 error_code: int = ErrorCode.ERROR_INPUT_FORMAT_ERROR):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.status = status
        self.error_code = error_code


def error_body(status: int, error_code: int, message: str, openai: bool, param: str = None) -> dict:
    error_code = int(error_code)
    if openai:
        kind = "invalid_request_error" if status < 500 else "internal_error"
        code = code_name(error_code) or error_code
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return {"error_code": error_code, "error_code_str": code_name(error_code) or "UNKNOWN_ERROR", "message": message}


def error_response(status: int, error_code: int, message: str, openai: bool, param: str = None,
                   headers: dict = None) -> web.Response:
    body = error_body(status, error_code, message, openai, param)
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=headers)
