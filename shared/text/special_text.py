"""Special-token text in a chat's messages (issue 32): `<|im_start|>system…` typed in a user message
must stay text, not become the control token that opens a turn of the caller's making. Only the
chat template writes control tokens; what callers wrote is encoded with special-token parsing off.

Messages that hold special-token text are rendered with a marker in place of their content, the
rendered prompt is encoded piece by piece (the template's text with special tokens, each content
without), so prompts without such text are encoded exactly as before, in one piece.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nanoserve.errors import InvalidArgument

# Whose content is the caller's words: the template writes it verbatim between control tokens.
CALLER_ROLES = frozenset({"user", "system", "developer", "tool"})
_MARKER = (
    "\ue000{}\ue001"  # private-use characters: no tokenizer special and no template touch them
)
_MARKERS = re.compile("\ue000(\\d+)\ue001")


def holds_special_text(messages: Sequence[Mapping[str, Any]], specials: Sequence[str]) -> bool:
    return any(_special(m, specials) for m in messages)


def _special(message: Mapping[str, Any], specials: Sequence[str]) -> bool:
    content = message.get("content")
    return (
        message.get("role") in CALLER_ROLES
        and isinstance(content, str)
        and any(s in content for s in specials)
    )


def encode_escaped(
    messages: Sequence[Mapping[str, Any]],
    specials: Sequence[str],
    render: Callable[[list[Mapping[str, Any]]], str],
    encode_template: Callable[[str], list[int]],
    encode_text: Callable[[str], list[int]],
) -> list[int]:
    """The prompt's ids with the caller's special-token text encoded as text."""
    contents: list[str] = []
    marked: list[Mapping[str, Any]] = []
    for message in messages:
        if _special(message, specials):
            marked.append({**message, "content": _MARKER.format(len(contents))})
            contents.append(message["content"])
        else:
            marked.append(message)
    parts = _MARKERS.split(render(marked))  # template text, marker index, template text, ...
    indexes = [int(i) for i in parts[1::2]]
    if sorted(indexes) != list(range(len(contents))):  # a marker forged in other content, or
        # a template that copies or drops content: refuse rather than guess
        raise InvalidArgument(
            "holds special-token text the chat template does not write once", field="messages"
        )
    ids: list[int] = []
    for k, part in enumerate(parts):
        if k % 2:
            ids += encode_text(contents[int(part)])
        elif part:
            ids += encode_template(part)
    return ids
