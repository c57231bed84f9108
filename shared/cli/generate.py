"""`nanoserve generate`: makes the call nanoserve.cli.generate_args parsed and prints it. The completion's
text goes to stdout (streamed when n is 1), tool calls after it as JSON lines; reasoning, logprobs and
usage go to stderr; --json prints one JSON line per completion instead.
"""

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from nanoserve.cli.generate_args import GenerateArgs, parse
from nanoserve.client import Chunk, Client, Completion, join_chunks
from nanoserve.client.args import print_error
from nanoserve.errors import ServiceError


def generate(argv: Sequence[str]) -> int:
    args = parse(argv)
    live = _Live(args)
    try:
        with Client(**args.client) as client:
            if args.chat:
                stream = client.chat_stream([("user", args.prompt)], **args.call)
            else:
                stream = client.generate_stream(args.prompt, **args.call)
            chunks = []
            for chunk in stream:
                live.show(chunk)
                chunks.append(chunk)
            done = join_chunks(chunks)
    except ServiceError as e:
        live.end_line()
        return print_error(e)
    except KeyboardInterrupt:  # Ctrl-C: the call is cancelled on the way out; no traceback
        live.end_line()
        return 130
    choices = done.choices or (done,)
    labelled = len(choices) > 1
    if args.as_json:
        for index, choice in enumerate(choices):
            print(json.dumps(completion_json(index, choice), ensure_ascii=False))
    else:
        for index, choice in enumerate(choices):
            if labelled:
                print(f"[{index}] {choice.text}")
                if choice.reasoning_content:
                    print(f"[{index}] reasoning: {choice.reasoning_content}", file=sys.stderr)
            _print_tool_calls(index if labelled else None, choice)
            _print_logprobs(index if labelled else None, choice)
    if not args.as_json and done.prompt_token_ids is not None:
        print(f"prompt_token_ids={' '.join(map(str, done.prompt_token_ids))}", file=sys.stderr)
    if args.usage:
        reasons = ",".join(c.finish_reason for c in choices)
        print(
            f"finish_reason={reasons} prompt_tokens={done.usage.prompt_tokens} "
            f"completion_tokens={done.usage.completion_tokens} "
            f"cached_tokens={done.usage.cached_tokens}",
            file=sys.stderr,
        )
    return 0


class _Live:
    """Streams one completion (n unset or 1, no --json) as it arrives: text to stdout, reasoning
    to stderr; otherwise prints nothing until the call has ended."""

    def __init__(self, args: GenerateArgs) -> None:
        self.on = not args.as_json and args.call.get("n", 1) == 1
        self.open_line = False  # stdout holds text not yet ended by a newline
        self.reasoning_open = False  # the same on stderr

    def show(self, chunk: Chunk) -> None:
        if not self.on:
            return
        if chunk.reasoning_content:
            sys.stderr.write(chunk.reasoning_content)
            sys.stderr.flush()
            self.reasoning_open = not chunk.reasoning_content.endswith("\n")
        if chunk.text:
            self._end_reasoning()  # the reply starts on a line of its own
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            self.open_line = True
        if chunk.finish_reason is not None:
            self._end_reasoning()
            sys.stdout.write("\n")  # even after no text: the tool calls' lines come next
            sys.stdout.flush()
            self.on = self.open_line = False

    def end_line(self) -> None:
        """Ends a line the stream left open when the call failed."""
        self._end_reasoning()
        if self.open_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.open_line = False

    def _end_reasoning(self) -> None:
        if self.reasoning_open:
            sys.stderr.write("\n")
            self.reasoning_open = False


def completion_json(index: int, c: Completion) -> dict[str, Any]:
    """One --json line: the fields every completion has, then those it has content for."""
    line: dict[str, Any] = {
        "index": index,
        "text": c.text,
        "finish_reason": c.finish_reason,
        "token_ids": c.token_ids,
    }
    if c.prompt_token_ids is not None:
        line["prompt_token_ids"] = c.prompt_token_ids
    if c.matched_stop is not None:
        line["matched_stop"] = c.matched_stop
    if c.reasoning_content:
        line["reasoning_content"] = c.reasoning_content
    if c.tool_calls:
        line["tool_calls"] = [call.to_dict() for call in c.tool_calls]
    if c.tool_call_parse_error:
        line["tool_call_parse_error"] = True
    if c.logprobs is not None:
        line["logprobs"] = [dataclasses.asdict(entry) for entry in c.logprobs]
    return line


def _print_tool_calls(index: int | None, c: Completion) -> None:
    """Each call as one JSON line in OpenAI's shape ("index" first when n > 1), as the Node client
    prints them."""
    for call in c.tool_calls:
        line = call.to_dict() if index is None else {"index": index, **call.to_dict()}
        print(json.dumps(line, ensure_ascii=False))
    if c.tool_call_parse_error:
        label = "" if index is None else f"[{index}] "
        print(f"{label}warning: a <tool_call> block held no valid call", file=sys.stderr)


def _print_logprobs(index: int | None, c: Completion) -> None:
    """One stderr line per generated token: id, logprob, text and the alternatives, tab-separated
    (the Node client's lines; texts JSON-quoted, so spaces and newlines show)."""
    label = "" if index is None else f"[{index}] "
    for entry in c.logprobs or ():
        top = " ".join(f"{_quoted(t.text)}={t.logprob:.4f}" for t in entry.top_logprobs)
        print(
            f"{label}{entry.token_id}\t{entry.logprob:.4f}\t{_quoted(entry.text)}\t{top}",
            file=sys.stderr,
        )


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
