"""best_of > n on /v1/completions, between the joined gRPC call (n = best_of completions, each
token's logprob asked for) and the reply (app.py): the n completions with the highest cumulative
logprob, best first (vLLM's rule), with logprobs only where the client asked for them.
"""

from dataclasses import replace

from nanoserve.client.messages import Completion
from nanoserve.frontend.gateway.completion_params import BestOf


def cumulative_logprob(completion: Completion) -> float:
    """The sum of the generated tokens' logprobs: the last len(token_ids) entries (echo puts the
    prompt's first, the same for every completion)."""
    entries = completion.logprobs or []
    return sum(e.logprob for e in entries[len(entries) - len(completion.token_ids) :])


def keep_best(whole: Completion, best_of: BestOf) -> Completion:
    """The best n of the call's completions as the reply's choices. Ties keep the call's order
    (temperature 0: identical completions). Usage stays the call's: completion_tokens counts all
    best_of completions, what was computed (and what OpenAI bills best_of for; vLLM's V0 counted
    only the n returned)."""
    every = whole.choices or (whole,)
    ranked = sorted(every, key=cumulative_logprob, reverse=True)[: best_of.n]
    kept = [
        replace(
            c,
            choices=(),
            logprobs=None if best_of.strip_logprobs else c.logprobs,
            # the call's prompt entries ride on the first choice (join_chunks' convention)
            prompt_logprobs=whole.prompt_logprobs if i == 0 else None,
        )
        for i, c in enumerate(ranked)
    ]
    return kept[0] if len(kept) == 1 else replace(kept[0], choices=tuple(kept))
