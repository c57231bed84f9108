"""The text `nanoserve bench serving` prints without --json: one block per path (offline, frontend,
worker) from the result dict that benchmarks.serving.run returns."""


def summary(r: dict) -> str:
    """The result dict as a few lines a person reads (the JSON holds the same figures)."""
    lines = [
        f"serving {r['model']} tp={r['tp']}: {r['requests']} requests, "
        f"rate {r['request_rate']} req/s"
    ]
    if "offline" in r:
        o = r["offline"]
        lines.append(
            f"  offline   {o['tok_s']:>10,.0f} tok/s   one stream "
            f"{o['one_stream_ms_per_token']} ms/token, TTFT {o['one_stream_ttft_ms']} ms"
        )
    for t in ("frontend", "worker", "gateway"):
        if t not in r:
            continue
        x = r[t]
        ratio = f" ({r[t + '_over_offline']} of offline)" if t + "_over_offline" in r else ""
        if t == "gateway" and "gateway_over_frontend" in r:
            ratio += f" ({r['gateway_over_frontend']} of frontend)"
        lines.append(
            f"  {t:<9} {x['tok_s']:>10,.0f} tok/s{ratio}   one stream "
            f"{x.get('one_stream_ms_per_token')} ms/token, TTFT "
            f"{x.get('one_stream_ttft_ms')} ms; errors {x['errors']}"
        )
        lines.append(f"    TTFT ms {x['ttft_ms']}")
        lines.append(f"    ITL ms  {x['itl_ms']}")
        for bucket, s in x["ttft_ms_by_prompt_len"].items():
            lines.append(f"    TTFT ms, prompt {bucket}: {s}")
        if x["loadgen"]["saturated"]:
            lines.append(
                "    WARNING: a load-generator process was near one core: raise --client-procs"
            )
        lines.append(
            f"    load generator {x['loadgen']}; service CPU cores "
            f"{x['service_cpu_cores']}; messages/token {x['messages_per_token']}"
        )
    return "\n".join(lines)
