"""The gateway's bound on slow request headers (a slowloris client): uvicorn closes an idle
keep-alive connection after --keep-alive-timeout-s but waits for a request's headers forever. Its
HTTP protocol class, wrapped here, closes a connection whose next request's headers are not complete
within --header-timeout-s of the connection opening or of the previous response.
"""

import asyncio
from typing import Any


def with_header_timeout(protocol_class: type, timeout_s: float) -> type:
    """A subclass of uvicorn's HTTP protocol class (h11's or httptools': both keep the request
    being served as `cycle`, replaced when the next request's headers are complete)."""

    class HeaderTimeout(protocol_class):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_headers()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_headers()

        def _await_headers(self) -> None:
            # one timer a connection or a response: cheap, and it ends itself
            self.loop.call_later(timeout_s, self._headers_due, self.cycle)

        def _headers_due(self, cycle: Any) -> None:
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.close()  # no request began since: the client is too slow

    HeaderTimeout.__name__ = f"HeaderTimeout{protocol_class.__name__}"
    return HeaderTimeout
