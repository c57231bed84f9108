"""The table at the end of scripts/gpu_run.sh: reads the step logs in a directory (JSON lines of
the benchmarks, pytest's summary, each step's exit line), prints the figures that the issues are
judged by, and writes them all to results.json there. `python benchmarks/gpu_table.py DIR`
(standard library only: it runs even where nanoserve does not import)
"""

import json
import re
import sys
from pathlib import Path

STEP_END = re.compile(r"^=== (\S+): (exit \d+ after \d+ s|skipped.*)$")
PYTEST = re.compile(r"^=+ .*\b(passed|failed|error)\b.* in [\d.]+s")


# the served engine core's own warnings (worker/runner/serving_stalls.py): what stalled its steps
STALLS = ("specialised while serving", "garbage-collector pass")


def read(out: Path) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    for log in sorted(out.glob("*.log")):
        text = log.read_text(errors="replace")
        counts = [f"{text.count(s)} x '{s}'" for s in STALLS if s in text]
        if counts:
            notes.append(f"{log.stem:<16} engine core stalls while serving: {', '.join(counts)}")
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    rows.append(dict(json.loads(line), step=log.stem))
                except json.JSONDecodeError:
                    pass
            elif STEP_END.match(line) or PYTEST.match(line):
                notes.append(f"{log.stem:<16} {line.strip('= ')}")
    return rows, notes


def fmt(p: dict | None) -> str:
    """p50/p90/p99/max of a percentile summary."""
    if not p or not p.get("n"):
        return "-"
    return "/".join(f"{p[k]:g}" for k in ("p50", "p90", "p99", "max"))


def probe_text(p: dict) -> str:
    """One one-stream probe: `1.031 (cpu 99 wait 0.4 ics 2 vcs 5 steal 0.0 @3)`, the step loop's
    share of it (CPU %, run-queue wait %, preemptions, sleeps, its CPU's steal %, its CPUs)."""
    loop = p.get("step_loop")
    if not loop:
        return f"{p['ms_per_token']}"
    cpus = "/".join(map(str, loop["cpus"]))
    return (
        f"{p['ms_per_token']} (cpu {loop['cpu_pct']:.0f} wait {loop['wait_pct']}"
        f" ics {loop['preemptions']} vcs {loop.get('sleeps', '-')}"
        f" steal {loop.get('steal_pct', '-')} @{cpus})"
    )


def serving_lines(r: dict) -> list[str]:
    head = f"serving {r.get('model')} tp={r.get('tp')} rate={r.get('request_rate')} ({r['step']})"
    lines = [
        head,
        f"  {'path':<9} {'tok/s':>9} {'/offline':>8} {'1-stream ms/tok':>15} "
        f"{'TTFT ms':>8}  TTFT p50/p90/p99/max ms   ITL p50/p90/p99/max ms   "
        "loadgen cpu (busiest proc)",
    ]
    if "offline" in r:
        o = r["offline"]
        lines.append(
            f"  {'offline':<9} {o['tok_s']:>9,.0f} {'1':>8} "
            f"{o['one_stream_ms_per_token']:>15} {o['one_stream_ttft_ms']:>8}"
        )
    for t in ("frontend", "worker", "gateway", "chat"):
        if t not in r:
            continue
        x = r[t]
        lines.append(
            f"  {t:<9} {x['tok_s']:>9,.0f} {r.get(t + '_over_offline', '-'):>8} "
            f"{x.get('one_stream_ms_per_token', '-'):>15} {x.get('one_stream_ttft_ms', '-'):>8}  "
            f"{fmt(x['ttft_ms']):<24} {fmt(x['itl_ms']):<24} "
            f"{x['loadgen']['cpu_s']} s ({x['loadgen']['busiest_proc_cpu']})"
            + (f"  ERRORS {x['errors']}: {x['first_error'][:80]}" if x["errors"] else "")
        )
        if "one_stream_gap_ms" in x:  # a slower pace (p50) or a few stalls (p99, max)?
            lines.append(f"    one-stream gaps ms p50/p90/p99/max: {fmt(x['one_stream_gap_ms'])}")
        for tag, probes in (
            ("", x.get("one_stream_probes")),
            (" before", (x.get("one_stream_before_runs") or {}).get("one_stream_probes")),
        ):
            if probes:  # each probe's pace beside its step loop's CPU / run-queue wait / CPUs
                lines.append(
                    f"    one-stream probes{tag}: " + ", ".join(probe_text(p) for p in probes)
                )
        b = x.get("one_stream_before_runs")
        if b:  # the same before the throughput runs: does the load leave the stack slower?
            lines.append(
                f"    one-stream before the runs: {b['one_stream_ms_per_token']} ms/token, TTFT "
                f"{b['one_stream_ttft_ms']} ms, gaps {fmt(b['one_stream_gap_ms'])}"
            )
        if "tok_s_runs" in x:  # every fresh run: its /offline, and the services' spend per token
            offline = r.get("offline", {}).get("tok_s")
            runs = [f"{v / offline:.3f}" if offline else f"{v:,.0f}" for v in x["tok_s_runs"]]
            lines.append(f"    runs ({'/offline' if offline else 'tok/s'}): {', '.join(runs)}")
            for i, run in enumerate(x.get("runs", [])):
                spend = "; ".join(
                    f"{n} {s['cores']} cores {s['cpu_us_per_token']} us {s['writes_per_token']} w"
                    f" {s['ctxsw_per_token']} cs"
                    for n, s in run["services"].items()
                )
                if "worker_grpc_process" in run:  # the worker's tree holds its engine core
                    grpc_own = run["worker_grpc_process"]
                    spend += f" (worker gRPC process {grpc_own['cores']} cores"
                    spend += f" {grpc_own['cpu_us_per_token']} us)"
                lines.append(
                    f"    run {i}: {run['tok_s']:,.0f} tok/s ITL p50 {run['itl_p50_ms']} TTFT p50 "
                    f"{run['ttft_p50_ms']} msg/tok {run['messages_per_token']} loadgen "
                    f"{run['loadgen_busiest_proc_cpu']}; per token: {spend}"
                )
        lines.append(
            "    TTFT by prompt length: "
            + ", ".join(f"{b} {fmt(s)}" for b, s in x["ttft_ms_by_prompt_len"].items())
            + f"; service CPU cores {x['service_cpu_cores']}"
        )
        if x["loadgen"].get("saturated"):
            lines.append(
                "    WARNING: a load-generator process was near one core: raise --client-procs"
            )
    if "gateway_over_frontend" in r:
        lines.append(f"  gateway (HTTP) / frontend (gRPC) tok/s: {r['gateway_over_frontend']}")
    if "ttft_frontend_minus_worker_ms" in r:
        lines.append(
            f"  one-stream TTFT frontend - worker: {r['ttft_frontend_minus_worker_ms']} ms"
        )
    return lines


def roofline_lines(r: dict) -> list[str]:
    if r["bench"] == "roofline_phases":
        lines = [f"roofline {r['model']}: phase, steps, seconds, bound s, fraction of bound"]
        for name, p in r.items():
            if isinstance(p, dict):
                lines.append(
                    f"  {name:<17} {p.get('steps', ''):>5} {p.get('seconds', '-'):>8} "
                    f"{p['bound_s']:>8} {p.get('fraction_of_bound', '-'):>6}"
                )
        return lines
    classes = ", ".join(
        f"{c} {x['us_per_step']}/{x.get('bound_us', '-')}" for c, x in r["classes"].items()
    )
    ops = ", ".join(
        f"{op} {x['us_per_step']}/{x.get('bound_us', '-')}"
        for op, x in r.get("gemm_ops", {}).items()
    )
    if r["bench"] == "roofline_prefill":
        return [
            f"roofline prefill {r['tokens']} tokens: wall {r['wall_us_per_step']} µs (host "
            f"prepare {r['host_prepare_us']}), GPU {r['gpu_busy_us_per_step']}, bound "
            f"{r['step_bound_us']} ({r['fraction_of_bound']}); µs/bound per class: {classes}"
        ]
    return [
        f"roofline decode B={r['batch']} ctx={r['context']}: wall {r['wall_us_per_step']} µs, "
        f"GPU {r['gpu_busy_us_per_step']}, bound {r['step_bound_us']} "
        f"({r['fraction_of_bound']}); µs/bound per class: {classes}",
        f"  GEMMs, µs/bound a step: {ops}",
    ]


def arrivals_line(r: dict) -> str:
    """One `bench arrivals` run: its variant, pace, ITL ratio, TTFT, and its steps by kind."""
    steps = ", ".join(
        f"{kind} {k['ms'].get('n', 0)} x {k['ms'].get('p50', '-')} ms"
        for kind, k in r.get("steps", {}).items()
    )
    return (
        f"arrivals run {r.get('run')} cap {r.get('cap')} prompts-lookahead "
        f"{r.get('lookahead_prompts', 'off')}: {r.get('output_tok_s')} tok/s, ITL "
        f"{fmt(r.get('itl_ms'))} ms (p99/p50 {r.get('itl_p99_over_p50')}), TTFT "
        f"{fmt(r.get('ttft_ms'))} ms; steps: {steps}; slowest 1% end in "
        f"{r.get('slowest_1pct_of_gaps_end_in')}; slowest steps "
        f"{[(x['index'], x['kind'], x['ms']) for x in r.get('slowest_steps', [])]}; "
        f"stalls {r.get('stalls')}"
    )


def main(argv: list[str] | None = None) -> None:
    out = Path((argv or sys.argv[1:])[0])
    rows, notes = read(out)
    print("\n".join(notes))
    for r in rows:
        if r.get("bench") == "serving":
            print("\n".join(serving_lines(r)))
        elif str(r.get("bench")).startswith("roofline"):
            print("\n".join(roofline_lines(r)))
        elif r.get("bench") == "arrivals":
            print(arrivals_line(r))
        else:
            figs = {
                k: v
                for k, v in r.items()
                if k not in ("bench", "model", "tp", "step", "top_kernels_us_per_step")
            }
            print(
                f"{r.get('bench', r['step']):<11} {r.get('model', '-')!s:<11} "
                f"{r.get('tp', r.get('world_size', '-'))!s:<3} {figs}"
            )
    (out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
