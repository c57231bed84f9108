"""EngineConfig.prefill_sdpa_min_tokens: which steps attend with torch's SDPA (runner.prefill_graph.
takes_sdpa), and that such a step's forward, on the Triton backend with its kernels in the
interpreter, padded to a bucket, gives the reference forward's hidden states on the prompt's rows and
stores the same k/v in the cache (the q/k-norm + rotary kernel still stores them)."""

import numpy as np
import pytest
import torch

from nanoserve.worker.layers.context import get_context, reset_context, set_context
from nanoserve.worker.runner.prefill_graph import PrefillGraphRunner, one_prompt_step, takes_sdpa
from nanoserve.worker.runner.step_inputs import StepInputs
from tests.unit.test_prefill_graph_forward import BLOCK_SIZE, CONFIG, dummy_model, fresh_caches


def step(q_lens: list[int], context_lens: list[int], prefill: bool = True) -> StepInputs:
    n = sum(q_lens)
    return StepInputs(
        prefill,
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.zeros(n, np.int64),
        np.array([0, *np.cumsum(q_lens)]),
        np.array(context_lens),
        np.zeros((len(q_lens), 4), np.int64),
        np.array([n - 1]),
        max(q_lens),
        max(context_lens),
    )


@pytest.mark.parametrize(
    ("x", "lengths", "takes"),
    [
        (step([3000], [3000]), (2048, 8192), True),  # one prompt, nothing cached, in range
        (one_prompt_step(2048, 256), (2048, 8192), True),  # the start-up's step of a bucket
        (step([3000], [3000]), (0, 0), False),  # off
        (step([1000], [1000]), (2048, 8192), False),  # too short
        (step([9000], [9000]), (2048, 8192), False),  # past the largest bucket
        (step([3000], [3500]), (2048, 8192), False),  # a cached prefix or an earlier chunk
        (step([3000, 100], [3000, 100]), (2048, 8192), False),  # two prompts
        (step([1], [3000], prefill=False), (1, 8192), False),  # a decode step
    ],
)
def test_which_steps_attend_with_sdpa(x: StepInputs, lengths: tuple[int, int], takes: bool):
    assert takes_sdpa(x, lengths) is takes


@pytest.mark.parametrize(
    ("low", "backend", "world_size", "kv_dtype", "max_len", "lengths", "steps"),
    [
        (
            2048,
            "triton",
            1,
            torch.bfloat16,
            9000,
            (2048, 8192),
            [2048, 2560, 3072, 3584, 4096, 8192],
        ),
        (
            2000,
            "triton",
            1,
            torch.bfloat16,
            9000,
            (2000, 8192),
            [2048, 2560, 3072, 3584, 4096, 8192],
        ),
        # no one prompt pads past the bucket of max_model_len (the GPU test's 4,096 tokens) ...
        (2048, "triton", 1, torch.bfloat16, 4096, (2048, 4096), [2048, 2560, 3072, 3584, 4096]),
        # ... which may lie past max_model_len (a 4,500-token prompt pads to 8,192)
        (
            2048,
            "triton",
            1,
            torch.bfloat16,
            4500,
            (2048, 8192),
            [2048, 2560, 3072, 3584, 4096, 8192],
        ),
        (0, "triton", 1, torch.bfloat16, 9000, (0, 0), []),  # off
        (9000, "triton", 1, torch.bfloat16, 9000, (0, 0), []),  # past the largest bucket
        (5000, "triton", 1, torch.bfloat16, 4096, (0, 0), []),  # past max_model_len's bucket
        (2048, "torch", 1, torch.bfloat16, 9000, (0, 0), []),  # not the Triton backend
        (2048, "triton", 2, torch.bfloat16, 9000, (0, 0), []),  # tensor parallel
        (2048, "triton", 1, torch.float8_e4m3fn, 9000, (0, 0), []),  # an fp8 cache
    ],
)
def test_the_range_applies_where_it_can_and_arming_runs_a_step_of_each_bucket_in_it(
    low, backend, world_size, kv_dtype, max_len, lengths, steps
) -> None:
    """The lengths only where SDPA applies (set before the graphs are captured: buckets from the
    minimum get an SDPA graph); arming then runs a step of each bucket that a prompt of the
    minimum or more pads to, each taking the SDPA path (cuDNN builds its plans then)."""
    from types import SimpleNamespace

    from nanoserve.worker.config import EngineConfig
    from nanoserve.worker.runner.warmup import arm_sdpa_prefill, sdpa_prefill_range

    ran: list[int] = []
    runner = SimpleNamespace(
        config=EngineConfig(prefill_sdpa_min_tokens=low),
        prefill_buckets=[16, 1024, 2048, 2560, 3072, 3584, 4096, 8192],
        world_size=world_size,
        kv_dtype=kv_dtype,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        max_model_len=max_len,
        max_num_blocks_per_seq=-(-max_len // 256),
        prefill_graphs=None,  # eager: every bucket of the range is armed
    )
    runner.sdpa_lengths = sdpa_prefill_range(runner, backend)  # type: ignore[arg-type]
    assert runner.sdpa_lengths == lengths
    widths: list[int] = []
    runner.execute = lambda x: (
        ran.append(len(x.input_ids)),
        widths.append(x.block_tables.shape[1]),
    )
    arm_sdpa_prefill(runner)  # type: ignore[arg-type]
    assert ran == steps
    # every step's block table fits the runner's (the GPU's 5,120-token bucket over 16 blocks)
    assert all(w <= runner.max_num_blocks_per_seq for w in widths)
    assert all(takes_sdpa(one_prompt_step(n, 256), lengths) for n in steps)


def test_arming_skips_the_buckets_whose_sdpa_graph_was_captured() -> None:
    """A captured SDPA graph's capture already built cuDNN's plan for its shape (its warm-up
    forward) and was replayed once: arming runs eager steps only for the buckets without one."""
    from types import SimpleNamespace

    from nanoserve.worker.runner.warmup import arm_sdpa_prefill

    captured = {2048, 4096}
    ran: list[int] = []
    runner = SimpleNamespace(
        prefill_buckets=[16, 1024, 2048, 4096, 8192],
        sdpa_lengths=(1024, 8192),
        config=SimpleNamespace(kvcache_block_size=256),
        max_num_blocks_per_seq=32,
        device=torch.device("cpu"),
        prefill_graphs=SimpleNamespace(can_run=lambda n, sdpa=False: sdpa and n in captured),
        execute=lambda x: ran.append(len(x.input_ids)),
    )
    arm_sdpa_prefill(runner)  # type: ignore[arg-type]
    assert ran == [1024, 8192]


def test_the_default_takes_sdpa_from_1024_tokens() -> None:
    """On by default (2026-12-06: no allocation on its first prompts, top-1 agreement 0.998, 12-17%
    off a 4,000-token TTFT on an H100) where it applies: one rank, the Triton backend, a bf16 cache."""
    from types import SimpleNamespace

    from nanoserve.worker.config import EngineConfig
    from nanoserve.worker.runner.warmup import sdpa_prefill_range

    runner = SimpleNamespace(
        config=EngineConfig(),
        prefill_buckets=[16, 1024, 2048, 4096, 8192],
        world_size=1,
        kv_dtype=torch.bfloat16,
        dtype=torch.bfloat16,
        max_model_len=40960,
    )
    assert sdpa_prefill_range(runner, "triton") == (1024, 8192)  # type: ignore[arg-type]
    assert sdpa_prefill_range(runner, "torch") == (0, 0)  # type: ignore[arg-type]


def test_a_negative_minimum_is_refused() -> None:
    from nanoserve.worker.config import EngineConfig

    with pytest.raises(ValueError, match="prefill_sdpa_min_tokens"):
        EngineConfig(prefill_sdpa_min_tokens=-1)


@pytest.mark.parametrize("through", ["model", "graph runner"])
def test_an_sdpa_step_gives_the_reference_forward_and_cache(through: str):
    """Eagerly, and through the prefill graph runner's SDPA forward for its bucket (the forward a
    CUDA graph captures; here run eagerly), whose batch buffers hold a stale larger step."""
    model = dummy_model()
    n, bucket = 19, 32  # one prompt padded to its bucket: the padding's rows come after it
    ids = torch.randint(0, CONFIG.vocab_size, (n,))
    positions = torch.arange(n)
    tables = torch.tensor([[2, 5, 6]], dtype=torch.int32)
    slots = (tables[0, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE).int()
    ctx = dict(
        is_prefill=True,
        cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
        context_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=tables,
        max_seqlen_q=n,
        max_seqlen_k=n,
    )
    with torch.no_grad():
        ref_layers = fresh_caches(model, "torch")
        set_context(slot_mapping=slots, **ctx)
        ref = model(ids, positions)
        ref_k = [layer.k_cache.clone() for layer in ref_layers]
        ref_v = [layer.v_cache.clone() for layer in ref_layers]

        layers = fresh_caches(model, "triton")
        pad = bucket - n
        padded_slots = torch.cat([slots, torch.full((pad,), -1, dtype=torch.int32)])
        set_context(slot_mapping=padded_slots, sdpa_prefill=True, **ctx)
        padded_ids = torch.cat([ids, torch.zeros(pad, dtype=torch.long)])
        padded_positions = torch.cat([positions, torch.zeros(pad, dtype=torch.long)])
        if through == "model":
            out = model(padded_ids, padded_positions)
        else:
            runner = PrefillGraphRunner(
                model, [16, 32], 4, 3, torch.device("cpu"), capture=False, sdpa_lengths=(32, 32)
            )
            assert runner.can_run(bucket, sdpa=True) and runner.can_run(bucket)
            assert not runner.can_run(16, sdpa=True) and runner.can_run(16)
            runner.cu_seqlens_q[:] = torch.tensor([0, 3, 6, 9, 12])  # stale: SDPA reads none
            runner.context_lens[:] = 9
            out = runner.run(padded_ids, padded_positions, get_context()).clone()
            # the bucket's other forward (the Triton kernel's, for any step) is kept apart
            assert (bucket, False) not in runner.hidden
        reset_context()
    assert out.shape == (bucket, CONFIG.hidden_size)
    torch.testing.assert_close(out[:n], ref, atol=1e-4, rtol=1e-4)
    for layer, k, v in zip(layers, ref_k, ref_v):  # the same k/v at the same slots
        torch.testing.assert_close(layer.k_cache, k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.v_cache, v, atol=1e-5, rtol=1e-5)


def test_an_sdpa_graphs_warmup_calls_sdpa_as_its_step_does(monkeypatch) -> None:
    """Capture warms an SDPA graph up with the SDPA call alone (the rest of its forward ran at the
    bucket's shapes in the graph captured just before): that call must be the one a step makes,
    the same shapes, strides and dtype (cuDNN's plan is built per layout), or a step would build a
    plan while serving."""
    from nanoserve.worker.layers.attention import Attention

    model = dummy_model()
    fresh_caches(model, "triton")
    calls: list[tuple] = []
    real = Attention.sdpa_prefill

    def seen(self, q, k, v):
        calls.append(tuple((t.shape, t.stride(), t.dtype) for t in (q, k, v)))
        return real(self, q, k, v)

    monkeypatch.setattr(Attention, "sdpa_prefill", seen)
    runner = PrefillGraphRunner(
        model, [16, 32], 4, 3, torch.device("cpu"), capture=False, sdpa_lengths=(32, 32)
    )
    with torch.no_grad():
        runner._sdpa_warmup(32)()
        warmup, calls[:] = calls[:], []
        set_context(
            is_prefill=True,
            slot_mapping=torch.full((32,), -1, dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, 32], dtype=torch.int32),
            context_lens=torch.tensor([32], dtype=torch.int32),
            block_tables=torch.zeros(1, 3, dtype=torch.int32),
            sdpa_prefill=True,
        )
        runner.run(torch.zeros(32, dtype=torch.long), torch.arange(32), get_context())
        reset_context()
    assert len(warmup) == 1 and calls and set(calls) == set(warmup)


def test_cudnn_takes_is_asked_once_per_layout() -> None:
    """On the CPU no cuDNN: False (sdpa_prefill then copies q, k, v dense), remembered by layout."""
    from nanoserve.worker.layers import attention

    q = torch.randn(1, 4, 32, 16).transpose(1, 2).contiguous().transpose(1, 2)
    k = torch.randn(1, 2, 32, 16)
    before = len(attention._CUDNN_TAKES)
    assert attention.cudnn_takes(q, k, k) is False
    assert attention.cudnn_takes(q, k, k) is False
    assert len(attention._CUDNN_TAKES) == before + 1


def test_the_prefill_kernels_tile_steps_take_the_triton_kernel_and_the_sdpa_steps_come_after(
    monkeypatch,
) -> None:
    """capture_and_compile's order with the SDPA range set from the start: the graphs are
    captured with an SDPA graph from the range's low end; the prefill attention's tile steps (one
    prompt each, which SDPA would take) run with the range off; the SDPA steps run with it on."""
    from types import SimpleNamespace

    from nanoserve.worker.config import EngineConfig
    from nanoserve.worker.runner import warmup
    from nanoserve.worker.runner.start_clock import StartClock

    seen: list[tuple[str, object]] = []
    runner = SimpleNamespace(
        start_clock=StartClock(torch.device("cpu")),
        config=EngineConfig(prefill_sdpa_min_tokens=1024),
        sdpa_lengths=(1024, 8192),
        model=None,
        max_model_len=8192,
        max_num_blocks_per_seq=32,
        model_config=SimpleNamespace(vocab_size=97),
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        prefill_buckets=[16, 1024, 8192],
        attention_layers=[None],
        block_size=256,
        execute=None,
        graph_memory_bytes=0,
    )

    def capture_graphs(*args, sdpa_lengths: tuple[int, int], **kw):
        seen.append(("graphs", sdpa_lengths))
        return None, None, 0

    monkeypatch.setattr(warmup, "capture_graphs", capture_graphs)
    monkeypatch.setattr(
        warmup,
        "compile_prefill_attention",
        lambda *a: seen.append(("tiles", runner.sdpa_lengths)),
    )
    monkeypatch.setattr(warmup, "compile_step_kernels", lambda *a: None)
    monkeypatch.setattr(warmup, "arm_sdpa_prefill", lambda r: seen.append(("sdpa", r.sdpa_lengths)))
    warmup.capture_and_compile(runner, "triton")  # type: ignore[arg-type]
    assert seen == [("graphs", (1024, 8192)), ("tiles", (0, 0)), ("sdpa", (1024, 8192))]
    assert runner.sdpa_lengths == (1024, 8192)
