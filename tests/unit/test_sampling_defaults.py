"""A model's generation_config.json sampling defaults fill the fields a request leaves unset (vLLM),
offline (LLM.generate) and through the worker's proto conversion; given fields always win."""

import json

import pytest

from nanoserve.proto.v1 import common_pb2
from nanoserve.sampling import Limits
from nanoserve.sampling_proto import from_proto
from nanoserve.worker import LLM, SamplingParams
from tests.unit.hf_reference import make_hf_model


def test_unset_fields_read_as_vllm_defaults_and_take_the_model_defaults():
    sp = SamplingParams(top_p=0.5, max_tokens=4)
    assert (sp.temperature, sp.top_k, sp.min_p, sp.repetition_penalty) == (1.0, -1, 0.0, 1.0)
    assert sp.unset == {"temperature", "top_k", "min_p", "repetition_penalty"}
    filled = sp.with_defaults({"temperature": 0.6, "top_p": 0.95, "top_k": 20})
    assert (filled.temperature, filled.top_p, filled.top_k) == (0.6, 0.5, 20)  # top_p was given
    assert filled.with_defaults({"temperature": 0.1}).temperature == 0.6  # resolved once
    assert SamplingParams(temperature=1.0).with_defaults({"temperature": 0.0}).temperature == 1.0


def test_proto_leaves_unset_fields_unset():
    sp = from_proto(common_pb2.SamplingParams(top_k=5), Limits(64, 512), frontend=False)
    assert "temperature" in sp.unset and "top_k" not in sp.unset
    assert sp.with_defaults({"temperature": 0.0, "top_k": 20}).top_k == 5


@pytest.fixture(scope="module")
def greedy_by_default(tmp_path_factory):
    """A tiny model whose generation_config.json makes sampling greedy (temperature 0)."""
    path = tmp_path_factory.mktemp("greedy_default")
    make_hf_model(path)
    gen_path = path / "generation_config.json"
    gen_path.write_text(json.dumps({**json.loads(gen_path.read_text()), "temperature": 0.0}))
    return LLM(path, device="cpu", kvcache_block_size=16, num_kvcache_blocks=64)


def test_model_default_temperature_zero_is_greedy(greedy_by_default):
    llm = greedy_by_default
    prompts = [[5, 9, 33, 2], [100, 7, 7]]
    greedy = llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    unset = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in unset] == [o.token_ids for o in greedy]
    # an explicit temperature is the caller's: sampling, not greedy
    hot = llm.generate(
        prompts,
        SamplingParams(temperature=5.0, seed=3, max_tokens=12, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.token_ids for o in hot] != [o.token_ids for o in greedy]


def test_params_cross_the_engine_core_frame_with_unset_fields_kept_unset() -> None:
    """The gRPC process sends SamplingParams to the engine process in a msgpack frame: every field
    packs, and the far side still knows which fields the request left unset (model defaults)."""
    import msgpack

    from nanoserve.sampling import SamplingParams

    sp = SamplingParams(temperature=None, top_p=0.5, stop_token_ids=(3, 4), max_tokens=7)
    again = SamplingParams(**msgpack.unpackb(msgpack.packb(sp.as_fields())))
    assert again == sp and again.unset == sp.unset and "temperature" in again.unset
    assert again.with_defaults({"temperature": 0.0, "top_p": 0.9}).temperature == 0.0
    assert again.with_defaults({"top_p": 0.9}).top_p == 0.5  # given: the default does not win
