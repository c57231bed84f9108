"""The offline half of `nanoserve bench serving`: LLM.generate on the same workload and engine
settings as the served runs, in its own process (`python -m nanoserve.benchmarks.offline SPEC`) so
that its GPU memory is free again before the worker starts. Prints one JSON line.
"""

import json
import statistics
import sys
import time

from nanoserve.benchmarks.workload import build

MARK = "offline-result "  # prefix of the result line, so that log lines on stdout do no harm


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(spec: dict) -> dict:
    """spec: settings (EngineConfig fields), shape [(prompt len, output len)], warmup_shape,
    temperature, one_stream {prompt_len, tokens, runs}."""
    from nanoserve.worker import LLM, SamplingParams

    settings = dict(spec["settings"])
    t = time.perf_counter()
    llm = LLM(settings.pop("model"), **settings)
    load_s = time.perf_counter() - t
    vocab = llm.model_config.vocab_size

    def generate(requests, temperature: float) -> float:
        params = [
            SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=r.max_tokens)
            for r in requests
        ]
        sync()
        t = time.perf_counter()
        llm.generate([r.prompt_token_ids for r in requests], params, use_tqdm=False)
        sync()
        return time.perf_counter() - t

    try:
        generate(build("offline-warmup", spec["warmup_shape"], vocab), spec["temperature"])
        requests = build("offline", spec["shape"], vocab)
        seconds = generate(requests, spec["temperature"])
        tokens = sum(r.max_tokens for r in requests)
        one = spec["one_stream"]
        ttft, ms_per_token = [], []
        for k in range(one["runs"]):
            (r,) = build(f"offline-one-{k}", [(one["prompt_len"], 1)], vocab)
            ttft.append(generate([r], 0.0))  # a fresh prompt: prefill + one token
            # both timed runs now find the prompt in the prefix cache alike: their difference is
            # `tokens` decode steps
            t1 = generate([r], 0.0)
            long = type(r)(r.request_id, r.prompt_token_ids, one["tokens"] + 1, 0.0)
            ms_per_token.append((generate([long], 0.0) - t1) / one["tokens"])
    finally:
        llm.shutdown()
    return dict(
        load_s=round(load_s, 1),
        seconds=round(seconds, 3),
        output_tokens=tokens,
        tok_s=round(tokens / seconds, 1),
        one_stream_ms_per_token=round(1000 * statistics.median(ms_per_token), 3),
        one_stream_ttft_ms=round(1000 * statistics.median(ttft), 2),
    )


def main() -> None:
    result = run(json.loads(sys.argv[1]))
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":  # tensor-parallel ranks are spawned: they re-import this module
    main()
