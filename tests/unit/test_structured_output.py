"""Structured output on the offline engine: the tiny random Qwen3 model (real Qwen vocabulary and
tokenizer) constrained by random JSON Schemas, regexes and EBNF grammars; with decode lookahead
on and off; the bitmask in the sampler; invalid constraints refused naming the field."""

import json
import random
import re

import pytest
import torch

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.runner.sampler import apply_token_bitmask

NAMES = ["id", "name", "ok", "tags", "kind", "n", "x", "meta"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A small schema whose every instance is short (bounded strings, integers, arrays), so that
    a random model ends within max_tokens."""
    kinds = ["string", "integer", "boolean", "null", "enum", "array"]
    if depth == 0 or (depth < 2 and rng.random() < 0.2):
        kind = "object"
    else:
        kind = rng.choice(kinds)
    if kind == "object":
        names = rng.sample(NAMES, rng.randint(1, 3))
        return {
            "type": "object",
            "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": [n for n in names if rng.random() < 0.7],
            "additionalProperties": False,
        }
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "enum":
        return {"enum": rng.sample(["a", "bc", "def", 1, 2, True, None], rng.randint(1, 4))}
    if kind == "array":
        item = rng.choice(
            [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 0, "maximum": 9}]
        )
        return {"type": "array", "items": item, "maxItems": rng.randint(0, 3)}
    return {"type": kind}


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    engine = LLM(str(tiny_model_dir), device="cpu", max_num_seqs=256)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def decode(tiny_model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    return lambda ids: tok.decode(ids)  # skips the special tokens: the eos that ended it


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 100_000) for _ in range(rng.randint(2, 8))] for _ in range(n)]


def check_json_cases(llm, decode, n: int, seed: int, temperature: float) -> None:
    rng = random.Random(seed)
    schemas = [random_schema(rng) for _ in range(n)]
    params = [
        SamplingParams(
            temperature=temperature,
            max_tokens=256,
            structured_output=("json_schema", json.dumps(s)),
        )
        for s in schemas
    ]
    outputs = llm.generate(prompts(n, seed), params, use_tqdm=False)
    for schema, out in zip(schemas, outputs):
        text = decode(out.token_ids)
        assert out.finish_reason == "stop", (schema, text)
        assert out.token_ids[-1] in llm.eos_token_ids  # the eos, allowed once the JSON is done
        jsonschema.validate(json.loads(text), schema)


def test_200_random_json_schemas_parse_and_validate(llm, decode):
    # greedy: the random schemas and prompts vary the outputs, and a step skips the softmax and
    # noise over 200 x 151,936 logits (the test's CPU time); the lookahead test samples
    check_json_cases(llm, decode, 200, seed=0, temperature=0.0)


def test_json_schemas_with_decode_lookahead(tiny_model_dir, decode):
    """Lookahead forwards step N+1 before step N's token is known; the mask is filled at sampling
    time, after N's token advanced the matcher, so the outputs stay valid."""
    engine = LLM(str(tiny_model_dir), device="cpu", decode_lookahead=True)
    try:
        check_json_cases(engine, decode, 24, seed=1, temperature=1.0)
        assert engine.model_runner.num_foreseen_steps > 0  # the steps did run ahead
    finally:
        engine.shutdown()


def test_json_schemas_arriving_with_prompt_lookahead(tiny_model_dir, decode):
    """Prompt lookahead forwards a step that admits a constrained prompt before the step ahead of
    it is known; its first token's mask is filled when it is sampled. Requests arriving between
    steps: every output validates, and each equals the one without any lookahead."""
    rng = random.Random(5)
    schemas = [random_schema(rng) for _ in range(12)]
    sp = [
        SamplingParams(
            temperature=0.0, max_tokens=256, structured_output=("json_schema", json.dumps(s))
        )
        for s in schemas
    ]
    outs = {}
    for mode in ("off", "prompts"):
        on = mode == "prompts"
        engine = LLM(str(tiny_model_dir), device="cpu", decode_lookahead=on, lookahead_prompts=on)
        try:
            seqs = []
            for step, (prompt, params) in enumerate(zip(prompts(len(sp), 6), sp)):
                seqs.append(engine.add_request(prompt, params))
                for _ in range(step % 3):  # 0, 1 or 2 steps between arrivals
                    engine.step()
            while not engine.is_finished():
                engine.step()
            outs[mode] = [s.completion_token_ids for s in seqs]
            if on:
                assert engine.model_runner.num_foreseen_steps > 0
        finally:
            engine.shutdown()
    assert outs["prompts"] == outs["off"]
    for schema, ids in zip(schemas, outs["prompts"]):
        jsonschema.validate(json.loads(decode(ids)), schema)


REGEXES = [
    r"[a-z]{3,8}@(foo|bar)\.com",
    r"\d{3}-\d{4}",
    r"(yes|no|maybe)",
    r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}",
]


def test_regex_outputs_fullmatch(llm, decode):
    params = [
        SamplingParams(temperature=1.0, max_tokens=64, structured_output=("regex", r))
        for r in REGEXES * 3
    ]
    for r, out in zip(REGEXES * 3, llm.generate(prompts(len(params), 2), params, use_tqdm=False)):
        assert out.finish_reason == "stop"
        assert re.fullmatch(r, decode(out.token_ids)), (r, decode(out.token_ids))


def test_processed_logprobs_see_the_grammar_and_raw_ones_do_not(llm, decode):
    """logprobs_mode "processed" is the distribution the sampler drew from: the grammar's mask
    included, so every alternative it reports is a token the grammar allowed there."""

    def run(mode: str):
        sp = SamplingParams(
            temperature=1.0,
            seed=3,
            max_tokens=8,
            structured_output=("regex", "(yes|no|maybe)"),
            logprobs=5,
            logprobs_mode=mode,
        )
        return llm.generate(prompts(1, 5), sp, use_tqdm=False)[0]

    words = ("yes", "no", "maybe")

    def allowed(ids: list[int]) -> bool:  # the text so far can still become (or is) a word
        text = decode(ids)
        return any(w.startswith(text) for w in words)

    out = run("processed")
    assert decode(out.token_ids) in words
    for i, (_, _, rank, top_ids, top_logprobs) in enumerate(out.logprobs):
        finite = [t for t, lp in zip(top_ids, top_logprobs) if lp > float("-inf")]
        assert finite and rank >= 1
        assert all(allowed(out.token_ids[:i] + [t]) for t in finite), (i, finite)
    raw = run("raw")
    assert raw.token_ids == out.token_ids  # the same seeded draws
    assert any(  # the model's own favourites include tokens the grammar forbids
        not allowed(raw.token_ids[:i] + [t])
        for i, entry in enumerate(raw.logprobs)
        for t in entry[3]
    )


def test_a_grammar_that_allows_none_of_the_allowed_ids_ends_the_request(llm, tiny_model_dir):
    """A regex and allowed_token_ids with no token in common: the request ends (abort, no
    token) instead of sampling token 0 from a row of -inf; its batch neighbours are untouched and
    no block stays held."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    z = [tok.token_to_id(t) for t in ("z", "zz", "Z")]
    assert all(t is not None for t in z)
    clash = SamplingParams(
        temperature=0, max_tokens=8, structured_output=("regex", "(yes|no)"), allowed_token_ids=z
    )
    fine = SamplingParams(temperature=0, max_tokens=8, structured_output=("regex", "(yes|no)"))
    free = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outs = llm.generate(prompts(3, 7), [clash, fine, free], use_tqdm=False)
    assert (outs[0].finish_reason, outs[0].token_ids) == ("abort", [])
    assert outs[1].finish_reason == "stop" and tok.decode(outs[1].token_ids) in ("yes", "no")
    assert len(outs[2].token_ids) == 5
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks


def test_grammar_and_json_object_with_free_rows_in_the_batch(llm, decode):
    """EBNF and any-JSON rows beside unconstrained rows: only the constrained ones are masked."""
    ebnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | [0-9]'
    params = [
        SamplingParams(temperature=1.0, max_tokens=64, structured_output=("grammar", ebnf)),
        SamplingParams(temperature=1.0, max_tokens=12),
        SamplingParams(temperature=0.0, max_tokens=64, structured_output=("json_object", "")),
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True),
    ]
    out = llm.generate(prompts(4, 3), params, use_tqdm=False)
    assert re.fullmatch(r"\([a-c0-9](,[a-c0-9])*\)", decode(out[0].token_ids))
    assert len(out[1].token_ids) <= 12 and len(out[3].token_ids) == 12
    if out[2].finish_reason == "stop":  # greedy any-JSON may run long on a random model
        assert isinstance(json.loads(decode(out[2].token_ids)), dict)
    else:
        assert decode(out[2].token_ids).startswith("{")


@pytest.mark.parametrize(
    "kind, spec",
    [
        ("json_schema", '{"type": "nope"}'),
        ("json_schema", "{not json"),
        ("json_schema", "[1, 2]"),
        ("regex", "(("),
        ("grammar", "root ::= undefined_rule"),
        ("grammar", ""),
        ("regex", "a" * 70_000),
        ("structural_tag", '{"type": "structural_tag", "format": {"type": "nope"}}'),
        ("structural_tag", '{"type": "structural_tag"}'),
        ("structural_tag", "[1]"),
    ],
)
def test_invalid_constraint_is_refused_naming_the_field(llm, kind, spec):
    with pytest.raises(ValueError, match=rf"^(sampling_params\.)?structured_output\.{kind}: "):
        llm.generate([[1, 2, 3]], SamplingParams(structured_output=(kind, spec)), use_tqdm=False)
    assert llm.is_finished()


def test_apply_token_bitmask_matches_unpacked_bits():
    gen = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word's high bits are past the vocabulary
    logits = torch.randn(3, vocab, generator=gen)
    bits = torch.rand(2, 128, generator=gen) < 0.5
    words = torch.zeros(2, 4, dtype=torch.int64)
    for t in range(128):
        words[:, t // 32] |= bits[:, t].long() << (t % 32)
    bitmask = words.to(torch.int32)  # wraps bit 31 into the sign, as xgrammar's words
    rows = torch.tensor([0, 2])
    out = apply_token_bitmask(logits, rows, bitmask)
    assert torch.equal(out[1], logits[1])
    for g, row in enumerate(rows.tolist()):
        want = logits[row].masked_fill(~bits[g, :vocab], float("-inf"))
        assert torch.equal(out[row], want)
    every = apply_token_bitmask(logits[:2], None, bitmask)  # rows None: row g is bitmask row g
    for g in range(2):
        assert torch.equal(every[g], logits[g].masked_fill(~bits[g, :vocab], float("-inf")))


def test_unconstrained_batches_have_no_mask(llm):
    from nanoserve.worker.sequence import Sequence

    seqs = [Sequence([1, 2], SamplingParams(temperature=1.0)) for _ in range(3)]
    assert llm.model_runner.sampling.prepare(seqs).allowed is None


def test_a_compiling_grammar_holds_up_no_other_request(llm, decode):
    """A sequence waits for its compile off the engine loop; the others step meanwhile; an abort
    while it compiles ends it at once."""
    import threading

    grammars = llm.grammars
    release = threading.Event()
    compile_now = grammars._compile

    def slow_compile(kind: str, spec: str):
        release.wait(60)
        return compile_now(kind, spec)

    grammars._compile = slow_compile  # the pool calls the instance's attribute
    try:
        slow = llm.add_request(
            [5, 6, 7], SamplingParams(max_tokens=8, structured_output=("regex", "[0-9]{2}"))
        )
        aborted = llm.add_request(
            [5, 6, 8], SamplingParams(max_tokens=8, structured_output=("regex", "[a-z]{2}"))
        )
        free = llm.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=3))
        while not free.is_finished:
            llm.step()
        assert slow.num_completion_tokens == 0 and not slow.is_finished
        from nanoserve.worker.core.stats_log import Load

        assert Load.of(llm).num_waiting == 2  # both compiling: reported as waiting
        assert llm.abort(aborted.request_id) and aborted.finish_reason is not None
        release.set()
        while not llm.is_finished():
            llm.step()
        assert slow.finish_reason.value == "stop"
        assert re.fullmatch("[0-9]{2}", decode(slow.completion_token_ids))
        assert aborted.num_completion_tokens == 0
    finally:
        release.set()
        del grammars._compile
