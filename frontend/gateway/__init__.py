"""The OpenAI-compatible HTTP gateway: an ASGI app (FastAPI on uvicorn) in its own process that
serves /v1/completions, /v1/chat/completions and /v1/models through the frontend's gRPC API.
`nanoserve gateway` or `python -m nanoserve.frontend.gateway` runs it (the `gateway` extra).
"""
