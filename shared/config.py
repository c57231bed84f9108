"""Turns a service's frozen config dataclass into command-line flags and back.

`python -m nanoserve.worker --help` and `python -m nanoserve.frontend --help` are generated from the dataclass fields:
field `max_num_seqs` becomes `--max-num-seqs`, with `NANOSERVE_MAX_NUM_SEQS` as an env fallback.
"""

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "NANOSERVE_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("none", "null")

T = TypeVar("T")


def env_var(name: str) -> str:
    """The environment variable that supplies the default of field `name`."""
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_bool(text: str) -> bool:
    if text.strip().lower() in _TRUE:
        return True
    if text.strip().lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {_TRUE + _FALSE}, got {text!r}")


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union type {annotation!r}: only `X | None` is")
        return args[0], True
    return annotation, False


def _converter(base: Any, optional: bool) -> Callable[[str], Any]:
    if base is bool:
        convert = parse_bool
    elif base in (int, float, str) or callable(base):
        convert = base
    else:
        raise TypeError(f"unsupported config field type {base!r}")

    def parse(text: str) -> Any:
        if optional and text.strip().lower() in _NONE:
            return None
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"invalid {getattr(base, '__name__', base)} value {text!r} ({e})"
            ) from None

    parse.__name__ = getattr(base, "__name__", "value")
    return parse


def add_config_args(parser: argparse.ArgumentParser, cls: type) -> argparse.ArgumentParser:
    """Adds one `--field-name` flag per field of the dataclass `cls`.

    Defaults come from `NANOSERVE_<FIELD>` when set, else from the dataclass. Help comes from
    `field(metadata={"help": ...})`. Bools get `--x/--no-x`; `X | None` fields accept `none`.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        base, optional = _unwrap_optional(hints[f.name])
        convert = _converter(base, optional)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        env = os.environ.get(env_var(f.name))
        if env is not None:
            try:
                default = convert(env)
            except argparse.ArgumentTypeError as e:
                parser.error(f"{env_var(f.name)}: {e}")
        help_text = f.metadata.get("help", "").replace("%", "%%")
        required = default is dataclasses.MISSING
        suffix = "required" if required else "default: %(default)s"
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "help": f"{help_text} ({suffix}; env {env_var(f.name)})".lstrip(),
        }
        if required:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        if base is bool and not optional:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = convert
            kwargs["metavar"] = getattr(base, "__name__", "VALUE").upper()
        parser.add_argument(flag(f.name), **kwargs)
    return parser


def config_from_args(cls: type[T], namespace: argparse.Namespace) -> T:
    """Builds `cls` from the parsed flags; the dataclass's __post_init__ may raise ValueError."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return cls(**{name: getattr(namespace, name) for name in names if hasattr(namespace, name)})


def parse_config(
    cls: type[T], argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> T:
    """Parses `argv` into `cls`; a validation ValueError becomes a clean argparse error (exit 2)."""
    if parser is None:
        doc = cls.__doc__ or ""
        # dataclass() fills a missing docstring with the signature, which is no description.
        parser = argparse.ArgumentParser(
            description=None if doc.startswith(cls.__name__ + "(") else doc
        )
    add_config_args(parser, cls)
    namespace = parser.parse_args(argv)
    try:
        return config_from_args(cls, namespace)
    except ValueError as e:
        parser.error(str(e))
