"""The OpenAI request bodies the gateway accepts, as pydantic models: the first check of every
request (types, ranges of the wire types, list lengths); params.py maps them onto the gRPC API.

Unknown fields are refused (400 naming them), as OpenAI does. Fields the gRPC API cannot serve yet
(n, logprobs, tools, ...) are declared loosely here so that params.py can name them in its 400.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The wire types of the SamplingParams fields: a larger JSON number is refused here, by name,
# instead of overflowing the proto.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
MAX_LIST = 1 << 20  # longest list of any field (prompt token ids); the body limit bounds the rest
Text = Annotated[str, Field(max_length=64 * 1024 * 1024)]
Name = Annotated[str, Field(max_length=256)]
StopStrings = str | Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's; only False is served


class OpenAIRequest(_Strict):
    """Fields both endpoints share: the model, streaming and the sampling parameters."""

    model: Name
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # sampling (OpenAI's, then vLLM's extra parameters)
    max_tokens: Int32 | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Int64 | None = None
    stop: StopStrings | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int32 | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: Annotated[list[UInt32], Field(max_length=4096)] | None = None
    # accepted, no effect on the reply
    user: Name | None = None
    metadata: dict[Name, Annotated[str, Field(max_length=512)]] | None = None
    store: bool | None = None
    service_tier: Name | None = None
    # not served by the gRPC API yet (params.NOT_YET says which values are no-ops)
    n: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    response_format: Any = None
    prompt_logprobs: Any = None


class CompletionRequest(OpenAIRequest):
    """POST /v1/completions. `prompt`: text, token ids, or a one-element list of either."""

    prompt: Text | Annotated[list[UInt32], Field(max_length=MAX_LIST)] | list[Any]
    best_of: Any = None
    echo: Any = None
    suffix: Any = None


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """One message; `content` is text or a list of text parts. Other part types and the tool
    fields are refused by params.py, naming them."""

    model_config = ConfigDict(extra="allow")

    role: Annotated[str, Field(max_length=32)]
    content: Text | Annotated[list[dict[str, Any]], Field(max_length=4096)] | None = None
    name: Name | None = None


class ChatTemplateKwargs(_Strict):
    enable_thinking: bool | None = None


class ChatCompletionRequest(OpenAIRequest):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=65536)]
    max_completion_tokens: Int32 | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
