"""The no-cache attention of the KV-cache sizing's warm-up (layers.attention.varlen_attention_torch):
sequences of one length attend together, and each equals its own causal attention alone."""

import torch

from nanoserve.worker.layers.attention import _attend, varlen_attention_torch


def test_grouped_lengths_equal_each_sequence_alone():
    gen = torch.Generator().manual_seed(0)
    lens = [5, 3, 5, 1, 0, 3, 5, 8]  # repeated lengths, an empty sequence
    hq, hkv, d = 4, 2, 16
    n = sum(lens)
    q, k, v = (torch.randn(n, h, d, generator=gen) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out = varlen_attention_torch(q, k, v, cu, 0.25)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e > s:
            torch.testing.assert_close(out[s:e], _attend(q[s:e], k[s:e], v[s:e], 0.25))


def test_many_equal_sequences_take_few_calls(monkeypatch):
    # the warm-up's shape at the default config: 256 sequences of 64 tokens (one length: one
    # SDPA call a layer). A loose bound: the old loop took one call a sequence.
    hq, hkv, d, seqs, length = 16, 8, 128, 256, 64
    q = torch.randn(seqs * length, hq, d)
    k, v = torch.randn(seqs * length, hkv, d), torch.randn(seqs * length, hkv, d)
    cu = torch.arange(0, seqs * length + 1, length, dtype=torch.int32)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    out = varlen_attention_torch(q, k, v, cu, d**-0.5)
    assert len(calls) == 1
    torch.testing.assert_close(out[:length], _attend(q[:length], k[:length], v[:length], d**-0.5))
