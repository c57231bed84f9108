"""The OpenAI request bodies the gateway accepts, as pydantic models: the first check of every
request (types, ranges of the wire types, list lengths); params.py maps them onto the gRPC API.

Unknown fields are refused (400 naming them), as OpenAI does. Fields the gRPC API cannot serve yet
(functions, suffix, ...) are declared loosely here so that params.py can name them in its 400.
Lists are bounded here; the frontend checks the tighter limits (tools, names, schema sizes).
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from nanoserve.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS


def at_most(limit: int) -> BeforeValidator:
    """Refuses a list or object of more than `limit` items before pydantic converts any of them:
    its own max_length counts after converting every item (a 600k-key logit_bias held the event
    loop for 0.3 s), and the event loop serves every caller."""

    def check(value: Any) -> Any:
        if isinstance(value, (list, dict)) and len(value) > limit:
            raise ValueError(f"at most {limit} items, got {len(value)}")
        return value

    return BeforeValidator(check)


MAX_LIST = 1 << 20  # longest list of any field (prompt token ids); the body limit bounds the rest
MAX_BATCH = 2048  # OpenAI's most prompts in one request (params.py serves a batch of one)


def prompt_shape(value: Any) -> Any:
    """A completions prompt: text, token ids (at most MAX_LIST), or a batch of prompts (at most
    MAX_BATCH), told apart by the first item before any item is converted."""
    if isinstance(value, list) and value:
        is_ids = isinstance(value[0], int)
        limit = MAX_LIST if is_ids else MAX_BATCH
        if len(value) > limit:
            kind = "token ids" if is_ids else "prompts in a batch"
            raise ValueError(f"at most {limit} {kind}, got {len(value)}")
    return value


# The wire types of the SamplingParams fields: a larger JSON number is refused here, by name,
# instead of overflowing the proto.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
Text = Annotated[str, Field(max_length=64 * 1024 * 1024)]
Name = Annotated[str, Field(max_length=256)]
StopStrings = (
    str
    | Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256), at_most(256)]
)
# OpenAI's logit_bias: {"token id": bias}; params.py reads the keys, the frontend checks the values
LogitBias = Annotated[
    dict[Annotated[str, Field(max_length=32)], float],
    Field(max_length=MAX_LOGIT_BIAS),
    at_most(MAX_LOGIT_BIAS),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's; only False is served


class JSONSchemaFormat(_Strict):
    name: Name
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: Text | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's response_format: text, any JSON object, or JSON valid against a schema; vLLM's
    structural_tag (xgrammar's format: `format` holds the tag's structure)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JSONSchemaFormat | None = None
    format: dict[str, Any] | None = None


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
    logit_bias: LogitBias | None = None
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int32 | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stop_token_ids: Annotated[list[UInt32], Field(max_length=4096), at_most(4096)] | None = None
    # only these ids may be sampled
    allowed_token_ids: (
        Annotated[
            list[UInt32],
            Field(min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS),
            at_most(MAX_ALLOWED_TOKEN_IDS),
        ]
        | None
    ) = None
    n: UInt32 | None = None
    prompt_logprobs: Int32 | None = None  # vLLM's
    logprobs_mode: Literal["raw", "processed"] | None = None  # vLLM's (a server flag there)
    response_format: ResponseFormat | None = None
    # vLLM's structured-output extras (one of them, or response_format)
    guided_json: dict[str, Any] | Text | None = None
    guided_regex: Text | None = None
    guided_grammar: Text | None = None
    priority: Int32 | None = None  # vLLM's: lower is served first
    return_token_ids: bool | None = None  # vLLM's: the reply's and the prompt's token ids too
    # accepted, no effect on the reply
    user: Name | None = None
    metadata: (
        Annotated[
            dict[Name, Annotated[str, Field(max_length=512)]], Field(max_length=16), at_most(16)
        ]
        | None
    ) = None
    store: bool | None = None
    service_tier: Name | None = None


class CompletionRequest(OpenAIRequest):
    """POST /v1/completions. `prompt`: text, token ids, or a one-element list of either."""

    prompt: Annotated[Text | list[UInt32] | list[Any], BeforeValidator(prompt_shape)]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None  # legacy: top alternatives
    best_of: UInt32 | None = None  # completion_params.py checks it against n
    echo: bool | None = None
    suffix: Any = None


class FunctionCall(_Strict):
    name: Name
    arguments: Text  # a JSON object as a string


class ToolCall(_Strict):
    """An assistant message's tool call, as a reply gave it."""

    id: Name
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message; `content` is text or a list of text parts. Other part types and unknown fields
    are refused by params.py, naming them."""

    model_config = ConfigDict(extra="allow")

    role: Annotated[str, Field(max_length=32)]
    content: (
        Text | Annotated[list[dict[str, Any]], Field(max_length=4096), at_most(4096)] | None
    ) = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=1024), at_most(1024)] | None = None
    tool_call_id: Name | None = None
    reasoning_content: Text | None = None


class FunctionSpec(_Strict):
    name: Name
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Strict):
    name: Name


class NamedToolChoice(_Strict):
    """tool_choice {"type": "function", "function": {"name": ...}}: call this tool, once."""

    type: Literal["function"]
    function: NamedFunction


class ChatTemplateKwargs(_Strict):
    enable_thinking: bool | None = None


class ChatCompletionRequest(OpenAIRequest):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=65536), at_most(65536)]
    max_completion_tokens: Int32 | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=1024), at_most(1024)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    separate_reasoning: bool | None = None  # reasoning_content apart from content (see README)
    functions: Any = None
    function_call: Any = None
