"""Structured output on CUDA: random JSON Schemas on the tiny model (real Qwen vocabulary) with
decode lookahead and CUDA graphs on (the CUDA defaults), every output valid; the mask is applied to
the logits the graph returned, at sampling time."""

import pytest
import torch

from tests.unit.test_structured_output import check_json_cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("xgrammar")
pytest.importorskip("jsonschema")


def test_json_schemas_with_lookahead_and_graphs(tiny_model_dir):
    from tokenizers import Tokenizer

    from nanoserve.worker import LLM

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    llm = LLM(str(tiny_model_dir), device="cuda", max_num_seqs=128, num_kvcache_blocks=1024)
    try:
        assert llm.model_runner.uses_lookahead and llm.model_runner.graphs is not None
        check_json_cases(llm, tok.decode, 128, seed=5, temperature=1.0)
        assert llm.model_runner.num_foreseen_steps > 0
    finally:
        llm.shutdown()
