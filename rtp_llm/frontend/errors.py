"""HTTP errors as JSON bodies: upstream's {error_code, error_code_str, message} on the native
routes, OpenAI's {"error": {...}} on /v1."""

import json

from aiohttp import web

# Upstream's ExceptionType numbers for frontend errors.
ERROR_INPUT_FORMAT_ERROR = 507
CONCURRENCY_LIMIT_ERROR = 513
UNKNOWN_ERROR = 514
_NAMES = {507: "ERROR_INPUT_FORMAT_ERROR", 511: "LONG_PROMPT_ERROR", 513: "CONCURRENCY_LIMIT_ERROR",
          514: "UNKNOWN_ERROR", 603: "GENERATE_TIMEOUT", 605: "INVALID_PARAMS", 606: "EXECUTION_EXCEPTION",
          607: "EXCEEDS_KV_CACHE_MAX_LEN", 8100: "CANCELLED"}


class RequestError(Exception):
    """Bad input: 400 naming the field."""

    def __init__(self, field: str, message: str, status: int = 400, error_code: int = ERROR_INPUT_FORMAT_ERROR):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.status = status
        self.error_code = error_code


def error_body(status: int, error_code: int, message: str, openai: bool, param: str = None) -> dict:
    if openai:
        kind = "invalid_request_error" if status < 500 else "internal_error"
        return {"error": {"message": message, "type": kind, "param": param, "code": _NAMES.get(error_code, error_code)}}
    return {"error_code": error_code, "error_code_str": _NAMES.get(error_code, "UNKNOWN_ERROR"), "message": message}


def error_response(status: int, error_code: int, message: str, openai: bool, param: str = None,
                   headers: dict = None) -> web.Response:
    body = error_body(status, error_code, message, openai, param)
    return web.Response(status=status, text=json.dumps(body), content_type="application/json", headers=headers)
