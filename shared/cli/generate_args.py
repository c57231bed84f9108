"""`nanoserve generate`'s command line -> GenerateArgs: the Client keywords (nanoserve.client.args)
and the generate_stream / chat_stream keywords, sampling flags from the schema (nanoserve.sampling).
nanoserve.cli.generate makes the call and prints it.

Flags are checked here only as far as building the request needs (a number, ID=BIAS, a readable
@FILE, the tools' JSON); ranges and meaning are the frontend's to check, and it names the field.
"""

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nanoserve.client.args import add_client_args, client_kwargs
from nanoserve.sampling import SCHEMA


def token_id(text: str) -> int:
    """An argparse type: a token id (an integer >= 0)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a token id (an integer >= 0): {text!r}")
    return value


def token_ids(text: str) -> list[int]:
    """An argparse type: comma-separated token ids."""
    return [token_id(part) for part in text.split(",")]


def token_bias(text: str) -> tuple[int, float]:
    """An argparse type: ID=BIAS."""
    token, _, bias = text.partition("=")
    try:
        return token_id(token), float(bias)
    except (argparse.ArgumentTypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected ID=BIAS, e.g. 9707=100, got {text!r}") from None


def text_or_file(text: str) -> str:
    """An argparse type: the text itself, or @FILE's contents."""
    if not text.startswith("@"):
        return text
    try:
        with open(text[1:], encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read {text[1:]}: {e}") from None


def tools_json(text: str) -> list[dict[str, Any]]:
    """An argparse type: a JSON list of OpenAI-style tools (TEXT or @FILE)."""
    source = text_or_file(text)
    try:
        tools = json.loads(source)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise argparse.ArgumentTypeError(
            'expected a JSON list of tools: [{"type": "function", "function": {"name": ...}}]'
        )
    return tools


# the shapes of nanoserve.sampling's flags: (argparse type, action, metavar)
_FLAG_SHAPES: dict[str, tuple[Callable[[str], Any] | None, Any, str | None]] = {
    "int": (int, "store", "INT"),
    "float": (float, "store", "FLOAT"),
    "text": (str, "append", "TEXT"),
    "ids": (token_ids, "extend", "ID[,ID...]"),
    "bias": (token_bias, "append", None),
    "switch": (None, argparse.BooleanOptionalAction, None),
}
_CLI_NOTES = {  # what the command does with a field, beyond the field's meaning
    "n": "printed by index as `[i] text`",
    "logprobs": "printed to stderr (--json: in the JSON)",
}
# the SamplingParams fields with a flag: `--max-tokens` for max_tokens, also the client's keyword
SAMPLING_FLAGS = tuple(f for f in SCHEMA if f.metadata["flag"] is not None)


def _add_sampling_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per SAMPLING_FLAGS field: its help, rule and metavar from the schema."""
    for f in SAMPLING_FLAGS:
        meta = f.metadata
        parse, action, metavar = _FLAG_SHAPES[meta["flag"]]
        notes = [meta["rule"][1]] if meta["rule"] is not None else []
        notes += [_CLI_NOTES[f.name]] if f.name in _CLI_NOTES else []
        notes += ["repeatable"] if action in ("append", "extend") else []
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "action": action,
            "help": meta["help"] + (f" ({'; '.join(notes)})" if notes else ""),
        }
        if parse is not None:
            kwargs.update(type=parse, metavar=meta["metavar"] or metavar)
        group.add_argument("--" + f.name.replace("_", "-"), **kwargs)


# structured_output.KINDS, each a flag of the mutually exclusive "structured output" group
STRUCTURED_OUTPUT = {
    "json_schema": "the output is JSON valid against this JSON Schema",
    "regex": "the whole output matches this regular expression",
    "grammar": "the output follows this EBNF grammar (GBNF dialect, start rule `root`)",
    "json_object": "the output is any JSON object",
    "structural_tag": "the output follows this xgrammar structural tag (JSON)",
}
# with --chat only: destination -> flag
CHAT_ONLY = {
    "thinking": "--thinking",
    "tools": "--tools",
    "tool_choice": "--tool-choice",
    "tool_choice_function": "--tool-function",
    "parallel_tool_calls": "--parallel-tool-calls",
    "separate_reasoning": "--separate-reasoning",
}


@dataclass(frozen=True)
class GenerateArgs:
    prompt: str
    chat: bool
    client: dict[str, Any]  # nanoserve.client.Client keywords
    call: dict[str, Any]  # generate_stream / chat_stream keywords
    as_json: bool  # print one JSON line per completion
    usage: bool


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanoserve generate",
        description="Stream a completion from a running frontend: the text to stdout; usage, "
        "logprobs and reasoning to stderr; tool calls as JSON lines after the text.",
    )
    parser.add_argument("prompt")
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="send the prompt as one user message through the chat template (default: off)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        metavar="INT",
        help="lower is served first (default: the server's, 0)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        metavar="N",
        help="one message per N tokens after the first, 1..256 (default: the frontend's)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each completion once it ended as one JSON line (index, text, finish_reason, "
        "token_ids, and logprobs, tool_calls, reasoning_content when there are any)",
    )
    parser.add_argument(
        "--usage",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="print token usage to stderr (default: off)",
    )
    parser.add_argument(
        "--prompt-token-ids",
        action="store_true",
        help="ask for the prompt's token ids as the frontend tokenized it (with --chat: the "
        "rendered template's), printed to stderr (--json: prompt_token_ids in each line)",
    )
    add_client_args(parser)
    _add_sampling_flags(parser.add_argument_group("sampling (unset: the server's default)"))
    structured = parser.add_argument_group(
        "structured output (one of; TEXT or @FILE)"
    ).add_mutually_exclusive_group()
    for kind, what in STRUCTURED_OUTPUT.items():
        option = "--" + kind.replace("_", "-")
        if kind == "json_object":
            structured.add_argument(option, action="store_true", help=what)
        else:
            structured.add_argument(option, type=text_or_file, metavar="TEXT", help=what)
    chat = parser.add_argument_group("chat (with --chat)")
    chat.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        help="Qwen3's enable_thinking (default: the chat template's)",
    )
    chat.add_argument(
        "--tools",
        type=tools_json,
        metavar="TEXT",
        help="a JSON list of OpenAI-style tools (TEXT or @FILE); calls print as JSON lines",
    )
    chat.add_argument(
        "--tool-choice",
        choices=("auto", "none", "required"),
        help="auto (default): the model may call tools; none: no tools; required: it must",
    )
    chat.add_argument(
        "--tool-function",
        dest="tool_choice_function",
        metavar="NAME",
        help="the model must call this one of --tools, once",
    )
    chat.add_argument(
        "--parallel-tool-calls",
        action=argparse.BooleanOptionalAction,
        help="--no-parallel-tool-calls: at most one call (required: exactly one; auto: the first "
        "call only) (default: the server's, several allowed)",
    )
    chat.add_argument(
        "--separate-reasoning",
        action="store_true",
        default=None,
        help="the model's <think> reasoning goes to stderr (--json: reasoning_content), not the text",
    )
    return parser


def parse(argv: Sequence[str]) -> GenerateArgs:
    """GenerateArgs from `nanoserve generate`'s argv; a bad flag exits 2 with argparse's error."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.chat:
        given = [flag for name, flag in CHAT_ONLY.items() if getattr(args, name) is not None]
        if given:
            parser.error(f"{given[0]} needs --chat")
    call: dict[str, Any] = {
        flag.name: getattr(args, flag.name)
        for flag in SAMPLING_FLAGS
        if getattr(args, flag.name) is not None
    }
    if "logit_bias" in call:
        call["logit_bias"] = dict(call["logit_bias"])  # a repeated ID: the last one wins
    kinds = [k for k in STRUCTURED_OUTPUT if getattr(args, k) not in (None, False)]
    if kinds:
        call["structured_output"] = {kinds[0]: getattr(args, kinds[0])}
    for name in ("priority", "stream_interval"):  # the request's own fields, not sampling's
        if getattr(args, name) is not None:
            call[name] = getattr(args, name)
    if args.prompt_token_ids:
        call["return_prompt_token_ids"] = True
    if args.chat:
        call["enable_thinking"] = args.thinking
        for name in CHAT_ONLY:
            if name != "thinking" and getattr(args, name) is not None:
                call[name] = getattr(args, name)
    return GenerateArgs(
        args.prompt, args.chat, client_kwargs(parser, args), call, args.json, args.usage
    )
