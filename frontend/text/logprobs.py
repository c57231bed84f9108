"""Logprob entries of a Generate/Chat response: the worker's TokenLogprobs (ids and numbers) with
each token's text added (unless the request asked for ids only), trimmed to the token ids the
response carries (a stop string ends them).
"""

from collections.abc import Callable, Sequence

from nanoserve.proto.v1 import common_pb2


def with_text(
    entries: Sequence[common_pb2.TokenLogprobs],
    token_texts: Callable[[list[int]], list[str]] | None,
) -> list[common_pb2.TokenLogprobs]:
    """Copies of `entries` with `text` set on each token and each alternative (one batch
    decode for all of them); `token_texts` None: the entries as they are (ids only)."""
    if token_texts is None:
        return list(entries)
    ids = [i for e in entries for i in (e.token_id, *(t.token_id for t in e.top_logprobs))]
    texts = iter(token_texts(ids))
    out = []
    for e in entries:
        filled = common_pb2.TokenLogprobs()
        filled.CopyFrom(e)
        filled.text = next(texts)
        for top in filled.top_logprobs:
            top.text = next(texts)
        out.append(filled)
    return out


def response_logprobs(
    logprobs: list[common_pb2.TokenLogprobs],
    prompt_logprobs: list[common_pb2.TokenLogprobs],
    num_tokens: int,
    token_texts: Callable[[list[int]], list[str]] | None,
) -> dict[str, list[common_pb2.TokenLogprobs]]:
    """The logprob fields of a response message carrying `num_tokens` token ids (none when the
    request did not ask)."""
    fields = {}
    if logprobs:
        fields["logprobs"] = with_text(logprobs[:num_tokens], token_texts)
    if prompt_logprobs:
        fields["prompt_logprobs"] = with_text(prompt_logprobs, token_texts)
    return fields
