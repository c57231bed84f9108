"""Bad configuration and bad input raise a clear ValueError naming what is wrong."""

import json

import pytest

from nanoserve.worker import LLM, SamplingParams
from nanoserve.worker.config import EngineConfig
from tests.unit.hf_reference import make_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("err_model")
    make_hf_model(path)
    return path


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(
        model_dir, device="cpu", kvcache_block_size=16, num_kvcache_blocks=8, max_model_len=512
    )


def test_missing_model_dir(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        LLM(tmp_path / "nope", device="cpu")


def test_dir_without_config(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        LLM(tmp_path, device="cpu")


def test_not_qwen3(tmp_path, model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="Qwen3"):
        LLM(tmp_path, device="cpu")


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(kvcache_block_size=12), "kvcache_block_size"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(dtype="int8"), "dtype"),
        (dict(device="tpu"), "device"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    ],
)
def test_bad_engine_config(kw, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kw)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(min_p=2), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(presence_penalty=3), "presence_penalty"),
    ],
)
def test_bad_sampling_params(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_bad_requests(llm):
    sp = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], sp, use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, 512]], sp, use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[-1]], sp, use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[3]], SamplingParams(stop_token_ids=[10**6]), use_tqdm=False)
    # the KV cache holds 8 * 16 = 128 tokens: max_model_len is lowered to that
    assert llm.max_model_len == 128
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[3] * 128], sp, use_tqdm=False)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate([[3] * 100], SamplingParams(max_tokens=40), use_tqdm=False)
    # nothing was admitted by the failed calls, and the engine still serves
    assert llm.is_finished() and llm.block_manager.num_free_blocks == 8
    out = llm.generate([[3] * 100], SamplingParams(max_tokens=28, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 28


def test_gpu_backends_need_cuda(model_dir):
    with pytest.raises(ValueError, match="attention_backend"):
        LLM(model_dir, device="cpu", attention_backend="triton")
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="xformers")


def test_the_offline_api_takes_the_workers_model_names():
    """LLM("tiny") loads the embedded model, as `--model tiny` does (a hub id resolves the same
    way, through nanoserve.model_files.resolve_model_dir)."""
    from nanoserve.tiny.model import default_model_dir

    llm = LLM("tiny", device="cpu", kvcache_block_size=16, num_kvcache_blocks=16)
    assert llm.config.model == str(default_model_dir())
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out[0].token_ids) == 2
