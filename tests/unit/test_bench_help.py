"""`nanoserve bench` and every benchmark it hands over to (`nanoserve bench NAME`): each flag and
positional has a help string, and each NAME is listed in `nanoserve bench --help`."""

import argparse
import importlib

import pytest

from nanoserve.benchmarks.engine import BENCHMARKS, build_parser


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """The options and positionals of `parser` (not --help) without a help string."""
    return [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        and (not action.help or action.help == argparse.SUPPRESS or not action.help.strip())
    ]


def test_the_engine_benchmark_documents_every_flag() -> None:
    parser = build_parser()
    assert undocumented(parser) == []
    listing = parser.format_help()
    for name in BENCHMARKS:
        assert f"  {name} " in listing, name


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_bench_subcommand_documents_every_flag(name: str) -> None:
    module = importlib.import_module(f"nanoserve.benchmarks.{BENCHMARKS[name][0]}")
    parser = module.build_parser()
    assert parser.prog == f"nanoserve bench {name}"
    assert len(parser._actions) >= 1
    assert undocumented(parser) == [], name
    parser.format_help()  # renders (a bad % in a help string raises here)
