"""The request parameters that shape the output rather than sample it, mapped onto SamplingParams:
chat's logprobs / top_logprobs, and response_format or vLLM's guided_json / guided_regex /
guided_grammar onto structured_output. params.py calls them; the frontend checks the values.
"""

from typing import Any

from nanoserve.frontend.gateway.errors import bad_param
from nanoserve.frontend.gateway.protocol import ChatCompletionRequest, OpenAIRequest

GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_grammar": "grammar"}


def map_logprobs(
    request: ChatCompletionRequest, sampling: dict[str, Any], param_names: dict[str, str]
) -> None:
    """Chat: `logprobs: true` asks for the sampled tokens' logprobs, `top_logprobs: k` for k
    alternatives too (SamplingParams.logprobs = k); top_logprobs alone is an error, as on OpenAI."""
    top = request.top_logprobs
    if not request.logprobs:
        if top:
            raise bad_param("top_logprobs", "requires logprobs: true")
        return
    sampling["logprobs"] = top or 0
    param_names["sampling_params.logprobs"] = "top_logprobs" if top else "logprobs"


def map_structured_output(request: OpenAIRequest) -> tuple[str, dict[str, Any]] | None:
    """(the parameter that asked for it, the client's structured_output dict), or None for free
    text. At most one of response_format (other than text) and the guided_* extras."""
    asked: list[tuple[str, dict[str, Any]]] = []
    rf = request.response_format
    if rf is not None and rf.type == "json_object":
        asked.append(("response_format", {"json_object": True}))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_param("response_format.json_schema.schema", "is required")
        asked.append(("response_format", {"json_schema": rf.json_schema.schema_}))
    elif rf is not None and rf.type == "structural_tag":
        if rf.format is None:
            raise bad_param("response_format.format", "is required")
        tag = {"type": "structural_tag", "format": rf.format}
        asked.append(("response_format", {"structural_tag": tag}))
    if rf is not None and rf.json_schema is not None and rf.type != "json_schema":
        raise bad_param("response_format.json_schema", 'needs type "json_schema"')
    if rf is not None and rf.format is not None and rf.type != "structural_tag":
        raise bad_param("response_format.format", 'needs type "structural_tag"')
    for name, kind in GUIDED.items():
        value = getattr(request, name)
        if value is not None:
            asked.append((name, {kind: value}))
    if len(asked) > 1:
        raise bad_param(asked[1][0], f"give one of {asked[0][0]} and {asked[1][0]}, not both")
    return asked[0] if asked else None
