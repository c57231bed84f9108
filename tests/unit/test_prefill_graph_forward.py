"""The prefill graphs' forward (worker.runner.prefill_graph) run eagerly on CPU, its Triton kernels in
the interpreter: a step padded to a bucket, its metadata copied into the runner's fixed-batch
buffers (stale rows from an earlier, larger step among them), gives the plain model forward's
hidden states and KV cache (on CUDA the same forward is captured)."""

import torch

from nanoserve.worker.layers.attention import Attention
from nanoserve.worker.layers.context import get_context, reset_context, set_context
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.model.qwen3 import Qwen3ForCausalLM
from nanoserve.worker.runner.device import init_dummy_weights
from nanoserve.worker.runner.prefill_graph import PrefillGraphRunner
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
        runner.cu_seqlens_q[:] = torch.tensor([0, 3, 6, 9, 12])
        runner.context_lens[:] = 9
        runner.block_tables[:] = 7
        pad = 32 - n
        padded_slots = torch.cat([slots, torch.full((pad,), -1)]).int()
        set_context(slot_mapping=padded_slots, **ctx)
        assert runner.can_run(32) and not runner.can_run(n)
        out = runner.run(
            torch.cat([ids, torch.zeros(pad, dtype=torch.long)]),
            torch.cat([positions, torch.zeros(pad, dtype=torch.long)]),
            get_context(),
        )
        reset_context()
    assert out.shape == (32, CONFIG.hidden_size)
    torch.testing.assert_close(out[:n], ref, atol=1e-4, rtol=1e-4)
    for layer, k in zip(layers, ref_k):  # the same k/v at the same slots, nothing at the padding's
        torch.testing.assert_close(layer.k_cache, k, atol=1e-5, rtol=1e-5)
