"""Process fixtures of the end-to-end tests: the worker + frontend pair most tests share, the
gateway in front of it, TLS certificates and the offline engine as the reference (the processes
themselves: tests/e2e/processes.py). Every fixture stops exactly the processes it started.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.e2e.processes import BLOCK_SIZE, NUM_BLOCKS, Pair, Service, start_pair

if TYPE_CHECKING:
    import openai

    from tests.tls_certs import Certs


@pytest.fixture(scope="session")
def services(tiny_model_dir: Path) -> Iterator[Pair]:
    """The worker + frontend pair most e2e tests share (tiny model, block size 16)."""
    pair = start_pair(tiny_model_dir)
    yield pair
    pair.stop()


@pytest.fixture(scope="module")
def gateway(services: Pair) -> Iterator[Service]:
    """`python -m nanoserve.frontend.gateway` in front of `services`. The gateway fixtures import
    tests/e2e/gateway_process (which imports tests/e2e/processes) and `openai` where they run."""
    from tests.e2e.gateway_process import start_gateway

    gateway = start_gateway(services.frontend.address)
    yield gateway
    assert gateway.stop() == 0, gateway.output()


@pytest.fixture(scope="module")
def model(gateway: Service) -> str:
    """The one model `gateway` serves, as the `openai` SDK lists it."""
    import openai

    from tests.e2e.gateway_process import base_url

    client = openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused")
    (model,) = client.models.list().data
    return model.id


@pytest.fixture(scope="module")
def sdk(gateway: Service) -> openai.OpenAI:
    """An `openai` SDK client of `gateway`, without retries."""
    import openai

    from tests.e2e.gateway_process import base_url

    return openai.OpenAI(base_url=base_url(gateway) + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate and a client certificate (tests/tls_certs), shared by the TLS
    tests; imported here, so that only they need `cryptography`."""
    from tests.tls_certs import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def offline_llm(tiny_model_dir: Path):
    """The offline engine on the same model and KV layout as the `services` worker."""
    from nanoserve.worker import LLM

    llm = LLM(
        str(tiny_model_dir),
        device="cpu",
        kvcache_block_size=BLOCK_SIZE,
        num_kvcache_blocks=NUM_BLOCKS,
    )
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def reference(offline_llm):
    """reference(prompts_ids, **sampling) -> completion ids of the offline engine, per prompt."""
    from nanoserve.worker import SamplingParams

    def run(prompts: list[list[int]], **sampling) -> list[list[int]]:
        outputs = offline_llm.generate(prompts, SamplingParams(**sampling), use_tqdm=False)
        return [o.token_ids for o in outputs]

    return run
