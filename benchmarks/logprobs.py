"""Per-step device cost of logprobs (worker.runner.logprobs) at Qwen3's vocabulary: output rows
(log_softmax, gather, rank, top-k of B rows) and prompt rows (chunked), bf16 logits, CUDA events.

`python -m nanoserve.benchmarks.logprobs [--json]`: one line per (rows, k).
"""

import argparse
import json

import torch

from nanoserve.worker.runner.logprobs import PROMPT_CHUNK_ROWS, pack

VOCAB = 151936


def time_ms(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    dev = torch.device("cuda")
    results: list[dict] = []
    for rows, k in [(1, 0), (1, 20), (64, 5), (256, 0), (256, 20)]:
        logits = torch.randn(rows, VOCAB, device=dev, dtype=torch.bfloat16)
        ids = torch.randint(0, VOCAB, (rows,), device=dev)

        def output() -> torch.Tensor:
            return pack(logits.float().log_softmax(dim=-1), ids, k)

        results.append(
            {"bench": "logprobs_output", "rows": rows, "k": k, "ms": round(time_ms(output), 4)}
        )
    rows, k = 2048, 5  # a prompt chunk of 2048 positions
    logits = torch.randn(rows, VOCAB, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, VOCAB, (rows,), device=dev)

    def prompt() -> torch.Tensor:
        return torch.cat(
            [
                pack(
                    logits[i : i + PROMPT_CHUNK_ROWS].float().log_softmax(dim=-1),
                    ids[i : i + PROMPT_CHUNK_ROWS],
                    k,
                )
                for i in range(0, rows, PROMPT_CHUNK_ROWS)
            ]
        )

    results.append(
        {"bench": "logprobs_prompt", "rows": rows, "k": k, "ms": round(time_ms(prompt, 10), 4)}
    )
    for r in results:
        line = f"{r['bench']:16s} rows {r['rows']:5d} k {r['k']:2d}: {r['ms']:.4f} ms"
        print(json.dumps(r) if args.json else line)


if __name__ == "__main__":
    main()
