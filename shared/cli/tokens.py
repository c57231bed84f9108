"""`nanoserve tokenize TEXT` and `nanoserve detokenize ID...`: the served model's tokenizer through a
frontend's Tokenize and Detokenize calls, with the client commands' connection flags
(nanoserve.client.args).
"""

import argparse
import json
from collections.abc import Sequence

from nanoserve.cli.generate_args import token_id
from nanoserve.client import Client
from nanoserve.client.args import add_client_args, client_kwargs, print_error
from nanoserve.errors import ServiceError


def tokenize(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nanoserve tokenize",
        description="Print the token ids of TEXT under the served model's tokenizer, "
        "space-separated (what `nanoserve detokenize` reads).",
    )
    parser.add_argument("text")
    parser.add_argument(
        "--add-special-tokens",
        action=argparse.BooleanOptionalAction,
        help="add the tokenizer's special tokens (default: the server's)",
    )
    add_client_args(parser)
    args = parser.parse_args(argv)
    try:
        with Client(**client_kwargs(parser, args)) as client:
            ids = client.tokenize(args.text, args.add_special_tokens)
    except ServiceError as e:
        return print_error(e)
    print(" ".join(map(str, ids)))
    return 0


def detokenize(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="nanoserve detokenize",
        description="Print the text of token ids under the served model's tokenizer.",
    )
    parser.add_argument("token_ids", nargs="+", type=token_id, metavar="ID")
    parser.add_argument(
        "--skip-special-tokens",
        action=argparse.BooleanOptionalAction,
        help="leave special tokens out of the text (default: the server's)",
    )
    parser.add_argument(
        "--per-token",
        action="store_true",
        help="print each id and its own text (JSON-quoted), one a line, instead",
    )
    add_client_args(parser)
    args = parser.parse_args(argv)
    try:
        with Client(**client_kwargs(parser, args)) as client:
            done = client.detokenize(args.token_ids, args.skip_special_tokens)
    except ServiceError as e:
        return print_error(e)
    if args.per_token:
        for token, text in zip(args.token_ids, done.token_texts):
            print(f"{token}\t{json.dumps(text, ensure_ascii=False)}")
    else:
        print(done.text)
    return 0
