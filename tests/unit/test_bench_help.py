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


@pytest.mark.parametrize(
    "argv", [["--min-out", "100", "--max-out", "64"], ["--min-len", "0"], ["--max-len", "5"]]
)
def test_bench_serving_refuses_empty_length_ranges(argv: list[str], capsys) -> None:
    """An empty range is argparse's error (exit 2) naming the flags, not a traceback."""
    from nanoserve.benchmarks.serving import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    assert "must be in [1, --max-" in capsys.readouterr().err
