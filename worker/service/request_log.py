"""The worker's one log line for each request it refuses (validation, admission, the engine core) or
aborts (the frontend's cancel, a deadline, an operator's Abort, shutdown), under the id it was sent:
the frontend's `client-id#n`, so one grep finds the request in both services' logs.
"""

import json
import logging

from nanoserve.errors import echo

logger = logging.getLogger("nanoserve.worker.requests")
_as_json = False  # --log-format json (use_log_format)

# why a request ended without finishing; the code is the status its caller sees (or would)
CANCELLED_BY_CALLER = "aborted by its caller (the client cancelled, its deadline or a stop string)"
# (code, why) for the requests still live when a Session stream ends
SESSION_ENDED = ("CANCELLED", "the session stream ended (the frontend went away)")
SHUTTING_DOWN = ("UNAVAILABLE", "the worker is shutting down (its grace period ended)")


def use_log_format(log_format: str) -> None:
    """text (the default) or json: one object a line, as the frontend's request log writes it."""
    global _as_json
    _as_json = log_format == "json"


def log_request_end(request_id: str, code: str, why: str) -> None:
    """`request <id> <CODE>: <why>` at INFO (or its JSON object); the id and reason are capped as
    error details are."""
    if _as_json:
        fields = {"request_id": request_id[:128], "code": code, "reason": why[:512]}
        logger.info("%s", json.dumps(fields, ensure_ascii=True))
    else:
        logger.info("request %s %s: %s", echo(request_id, 128), code, why[:512])
