"""The prefill graphs' forward (worker.runner.prefill_graph) run eagerly on CPU, its Triton kernels in
the interpreter: a step padded to a bucket, its metadata copied into the runner's fixed-batch
buffers (stale rows from an earlier, larger step among them), gives the plain model forward's
hidden states and KV cache (on CUDA the same forward is captured)."""

import numpy as np
import torch

from nanoserve.worker.layers.attention import Attention
from nanoserve.worker.layers.context import reset_context, set_context
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from nanoserve.worker.runner.device import init_dummy_weights
from nanoserve.worker.runner.prefill_graph import PrefillGraphRunner
from nanoserve.worker.runner.step_inputs import StepInputs
from tests.unit.interpreted_kernels import kernels  # noqa: F401 (interpreter + numpy shim)

BLOCK_SIZE, NUM_BLOCKS = 8, 8
CONFIG = ModelConfig(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
)


def fresh_caches(model: Qwen3ForCausalLM, backend: str) -> list[Attention]:
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for layer in layers:
        shape = (NUM_BLOCKS, BLOCK_SIZE, layer.num_kv_heads, layer.head_dim)
        layer.k_cache, layer.v_cache = torch.zeros(shape), torch.zeros(shape)
        layer.backend = backend
    return layers


def dummy_model() -> Qwen3ForCausalLM:
    """CONFIG's model, seeded, with logits-scale activations (the dummy init's 0.02 is near zero)."""
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(CONFIG).eval()
    init_dummy_weights(model, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0, 1.0)
    return model


def stale_step(q_lens: list[int], ctx_lens: list[int], tables: list[list[int]]) -> StepInputs:
    """A prefill step padded to 32 tokens that stores nothing (every slot -1)."""
    n = sum(q_lens)
    return StepInputs(
        True,
        np.zeros(32, np.int64),
        np.zeros(32, np.int64),
        np.full(32, -1),
        np.array([0, *np.cumsum(q_lens)]),
        np.array(ctx_lens),
        np.array(tables),
        np.array([n - 1]),
        max(q_lens),
        max(ctx_lens),
    )


def test_the_graph_forward_over_fixed_batch_buffers_equals_the_model_forward():
    model = dummy_model()
    lens = [7, 12]  # two prompts, 19 tokens: padded to the bucket of 32
    n = sum(lens)
    ids = torch.randint(0, CONFIG.vocab_size, (n,))
    positions = torch.cat([torch.arange(k) for k in lens])
    tables = torch.tensor([[0, -1], [3, 5]], dtype=torch.int32)
    slots = torch.cat(
        [
            tables[0, 0] * BLOCK_SIZE + torch.arange(7),
            tables[1, positions[7:] // BLOCK_SIZE] * BLOCK_SIZE + positions[7:] % BLOCK_SIZE,
        ]
    )
    ctx = dict(
        is_prefill=True,
        cu_seqlens_q=torch.tensor([0, 7, n], dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables,
        max_seqlen_q=max(lens),
        max_seqlen_k=max(lens),
    )

    with torch.no_grad():
        ref_layers = fresh_caches(model, "torch")
        set_context(slot_mapping=slots.int(), **ctx)
        ref = model(ids, positions)
        ref_k = [layer.k_cache.clone() for layer in ref_layers]

        layers = fresh_caches(model, "triton")
        runner = PrefillGraphRunner(model, [16, 32], 4, 3, torch.device("cpu"), capture=False)
        # an earlier step of 4 sequences leaves rows 2..3 stale: the padding must hide them
        runner.run(stale_step([3, 3, 3, 3], [9, 9, 9, 9], [[7, 7, 7]] * 4), sdpa=False)
        pad = 32 - n
        x = StepInputs(
            True,
            torch.cat([ids, torch.zeros(pad, dtype=torch.long)]).numpy(),
            torch.cat([positions, torch.zeros(pad, dtype=torch.long)]).numpy(),
            torch.cat([slots, torch.full((pad,), -1)]).numpy(),
            ctx["cu_seqlens_q"].numpy(),
            ctx["context_lens"].numpy(),
            tables.numpy(),
            np.array([6, n - 1]),
            max(lens),
            max(lens),
        )
        assert runner.can_take(x, sdpa=False) and not runner.can_run(n)
        assert not runner.can_take(x, sdpa=True)  # no SDPA graphs here
        out, rows = runner.run(x, sdpa=False)
        reset_context()
    assert rows.tolist() == [6, n - 1]  # the logit rows, on the device
    assert out.shape == (32, CONFIG.hidden_size)
    torch.testing.assert_close(out[:n], ref, atol=1e-4, rtol=1e-4)
    for layer, k in zip(layers, ref_k):  # the same k/v at the same slots, nothing at the padding's
        torch.testing.assert_close(layer.k_cache, k, atol=1e-5, rtol=1e-5)


def test_every_graphs_idle_step_reads_ids_in_range_and_stores_nothing():
    """What a capture's warm-up and a graph's first replay at start-up run, before any step: the
    buckets' inputs overlap in one buffer, so one bucket's slots (-1) lie over a larger one's
    token ids and must not reach its embedding lookup (on the H100 an out-of-range gather)."""
    model = dummy_model()
    with torch.no_grad():
        layers = fresh_caches(model, "triton")
        runner = PrefillGraphRunner(
            model, [16, 32], 4, 3, torch.device("cpu"), capture=False, sdpa_lengths=(16, 32)
        )
        assert sorted(runner.steps) == [(16, False), (16, True), (32, False), (32, True)]
        read: list[tuple[torch.Tensor, torch.Tensor]] = []

        def reading(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            read.append((ids.clone(), positions.clone()))  # (on CPU -1 indexes the last row)
            return model(ids, positions)

        runner.model = reading  # type: ignore[assignment]
        for key in sorted(runner.steps, reverse=True):  # the captures' order: largest first
            runner.run_idle(key)
        reset_context()
    assert [len(ids) for ids, _ in read] == [32, 32, 16, 16]
    for ids, positions in read:
        assert 0 <= ids.min() and ids.max() < CONFIG.vocab_size
        assert 0 <= positions.min() and positions.max() < CONFIG.max_position_embeddings
    for layer in layers:  # slots -1: nothing stored
        assert not layer.k_cache.any() and not layer.v_cache.any()
