"""One completion of an n > 1 call ends at the frontend by a stop string: the frontend ends that
completion at the worker too (SessionRequest.completion_aborts), whose load shows it stopped while
the others run on to the same tokens as without the stop; the call's usage counts what was
returned."""

import time

from nanoserve.client import Client
from tests.e2e.processes import assert_idle, get_load

PROMPT = "Once upon a time"
SAMPLING = {"temperature": 1.0, "seed": 21, "max_tokens": 400, "ignore_eos": True, "n": 3}


def _early_unique_stop(texts: list[str]) -> tuple[int, str]:
    """(index, a string early in that completion's text that no other completion's text has)."""
    for start in range(40):
        for index, text in enumerate(texts):
            stop = text[start : start + 4]
            if len(stop) == 4 and not stop.isspace() and sum(stop in t for t in texts) == 1:
                return index, stop
    raise AssertionError(f"no early stop string unique to one completion in {texts!r}")


def test_a_stop_string_in_one_completion_stops_it_at_the_worker(services) -> None:
    address = services.worker.address
    with Client(services.frontend.address, timeout=120) as client:
        full = client.generate(PROMPT, **SAMPLING)
        texts = [c.text for c in full.choices]
        stopped_index, stop = _early_unique_stop(texts)
        running_after_stop = None
        chunks = []
        for chunk in client.generate_stream(PROMPT, stop=stop, **SAMPLING):
            chunks.append(chunk)
            if chunk.index == stopped_index and chunk.finish_reason is not None:
                # the other two still have hundreds of tokens to go: the worker runs only them
                deadline = time.monotonic() + 5.0
                while True:
                    load = get_load(address)
                    if load.num_running <= 2 or time.monotonic() > deadline:
                        break
                    time.sleep(0.005)
                running_after_stop = load.num_running
                assert not any(
                    c.finish_reason is not None and c.index != stopped_index for c in chunks
                ), "the other completions ended before the stop: raise max_tokens"
        assert running_after_stop == 2
        by_index: dict[int, list] = {i: [] for i in range(3)}
        for chunk in chunks:
            by_index[chunk.index].append(chunk)
        for index in range(3):
            text = "".join(c.text for c in by_index[index])
            ids = [t for c in by_index[index] for t in c.token_ids]
            finish = [c.finish_reason for c in by_index[index] if c.finish_reason is not None]
            if index == stopped_index:
                assert text == texts[index][: texts[index].index(stop)]
                assert finish == ["stop"] and len(ids) < SAMPLING["max_tokens"]
                assert ids == list(full.choices[index].token_ids[: len(ids)])
            else:  # untouched by the other's abort
                assert text == texts[index] and finish == ["length"]
                assert ids == list(full.choices[index].token_ids)
        usage = chunks[-1].usage
        assert usage is not None and [c for c in chunks if c.usage is not None] == [chunks[-1]]
        assert usage.prompt_tokens == full.usage.prompt_tokens
        returned = sum(len(c.token_ids) for c in chunks)
        assert usage.completion_tokens == returned < 3 * SAMPLING["max_tokens"]
        # the non-streaming call: the same completions and usage
        again = client.generate(PROMPT, stop=stop, **SAMPLING)
        assert [c.text for c in again.choices] == [
            "".join(c.text for c in by_index[i]) for i in range(3)
        ]
        assert again.usage == usage
    assert_idle(address)
