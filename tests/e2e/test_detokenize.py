"""Detokenize through the real frontend: the text of ids equals the tokenizer's decode, whole and
per id (special tokens kept or skipped as asked), it inverts Tokenize, and bad ids are
INVALID_ARGUMENT naming the field (a max_model_len + 1 list, an id past the vocabulary, none)."""

import asyncio

import pytest

from nanoserve.client import AsyncClient, Client
from nanoserve.errors import InvalidArgument

pytestmark = pytest.mark.e2e

TEXT = "Hello 世界🙂 <|im_end|> done"


def test_detokenize_inverts_tokenize(services, tokenizer) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        ids = client.tokenize(TEXT)
        whole = client.detokenize(ids, skip_special_tokens=False)
        skipped = client.detokenize(ids)
    assert whole.text == TEXT == tokenizer.decode(ids, skip_special_tokens=False)
    assert skipped.text == tokenizer.decode(ids, skip_special_tokens=True) != TEXT
    assert "<|im_end|>" not in skipped.text
    assert whole.token_texts == skipped.token_texts  # per id: special tokens always kept
    assert whole.token_texts == [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert "<|im_end|>" in whole.token_texts


def test_async_client_detokenizes(services) -> None:
    async def main() -> str:
        async with AsyncClient(services.frontend.address, timeout=30) as client:
            return (await client.detokenize(await client.tokenize("one two three"))).text

    assert asyncio.run(main()) == "one two three"


def test_bad_ids_name_the_field(services) -> None:
    with Client(services.frontend.address, timeout=30) as client:
        info = client.model_info()
        cases = {
            "token_ids": [],
            "token_ids[2]": [1, 2, info.vocab_size, 3],
        }
        for field, ids in cases.items():
            with pytest.raises(InvalidArgument) as raised:
                client.detokenize(ids)
            assert str(raised.value).startswith(f"{field}: ")
        with pytest.raises(InvalidArgument) as raised:
            client.detokenize([5] * (info.max_model_len + 1))
        assert str(raised.value).startswith("token_ids: ") and "max_model_len" in str(raised.value)
        assert len(client.detokenize([5] * info.max_model_len).token_texts) == info.max_model_len
