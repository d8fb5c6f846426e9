"""aiohttp middlewares: the API key, and every error as a JSON body (plus the request count
by route and status)."""

import asyncio
import hmac
import logging
from typing import Optional

from aiohttp import web

from rtp_llm.frontend.backend_client import BackendError
from rtp_llm.frontend.errors import ErrorCode, RequestError, error_response

log = logging.getLogger(__name__)

# Routes a load balancer probes without the key.
_OPEN_ROUTES = ("/health", "/status")


def auth_middleware(api_key: Optional[str]):
    @web.middleware
    async def auth(request: web.Request, handler):
        if api_key and request.path not in _OPEN_ROUTES:
            header = request.headers.get("Authorization", "")
            given = header[7:] if header.startswith("Bearer ") else request.headers.get("X-API-Key", "")
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                raise RequestError("Authorization", "missing or wrong API key (Authorization: Bearer <key>)", 401)
        return await handler(request)

    return auth


def _retry(status: int):
    return {"Retry-After": "1"} if status == 429 else None


def error_middleware(frontend):
    """Maps what a handler raises to a status and a JSON error body (native or OpenAI form by
    the path), and counts every answer in frontend.stats."""

    @web.middleware
    async def errors(request: web.Request, handler):
        openai = request.path.startswith("/v1")
        try:
            resp = await handler(request)
        except RequestError as e:
            resp = error_response(e.status, e.error_code, str(e), openai, e.field or None, _retry(e.status))
        except BackendError as e:
            resp = error_response(e.http_status, e.error_code, e.message, openai, e.param, _retry(e.http_status))
        except web.HTTPRequestEntityTooLarge:
            resp = error_response(413, ErrorCode.ERROR_INPUT_FORMAT_ERROR,
                                  f"body: larger than the limit of {frontend.max_body_size} bytes", openai, "body")
        except web.HTTPException as e:
            resp = error_response(e.status, ErrorCode.UNKNOWN_ERROR, e.reason, openai)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("internal error on %s", request.path)
            resp = error_response(500, ErrorCode.UNKNOWN_ERROR, "internal error", openai)
        route = request.match_info.route.resource
        frontend.stats.count(request.method, route.canonical if route else "unknown", resp.status)
        return resp

    return errors
