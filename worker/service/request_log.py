"""The worker's one log line for each request it refuses (validation, admission, the engine core) or
aborts (the frontend's cancel, a deadline, an operator's Abort, shutdown), under the id it was sent:
the frontend's `client-id#n`, so one grep finds the request in both services' logs.
"""

import logging

from nanoserve.errors import echo

logger = logging.getLogger("nanoserve.worker.requests")

# why a request ended without finishing; the code is the status its caller sees (or would)
CANCELLED_BY_CALLER = "aborted by its caller (the client cancelled, its deadline or a stop string)"
# (code, why) for the requests still live when a Session stream ends
SESSION_ENDED = ("CANCELLED", "the session stream ended (the frontend went away)")
SHUTTING_DOWN = ("UNAVAILABLE", "the worker is shutting down (its grace period ended)")


def log_request_end(request_id: str, code: str, why: str) -> None:
    """`request <id> <CODE>: <why>` at INFO; the id and reason are capped as error details are."""
    logger.info("request %s %s: %s", echo(request_id, 128), code, why[:512])
