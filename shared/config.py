"""Turns a service's frozen config dataclass into command-line flags and back.

`python -m nanoserve.worker --help` and `python -m nanoserve.frontend --help` are generated from the
dataclass fields: field `max_num_seqs` of WorkerConfig becomes `--max-num-seqs`, with
`NANOSERVE_WORKER_MAX_NUM_SEQS` as an env fallback (the class's `env_prefix`, so one environment can
configure both services).
"""

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

ENV_PREFIX = "NANOSERVE_"  # for a config class without its own `env_prefix`
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("none", "null")

T = TypeVar("T")


def env_prefix(cls: type) -> str:
    """`NANOSERVE_WORKER_` for WorkerConfig (its `env_prefix` class variable), else `NANOSERVE_`."""
    prefix = getattr(cls, "env_prefix", ENV_PREFIX)
    return prefix if isinstance(prefix, str) else ENV_PREFIX


def env_var(name: str, prefix: str = ENV_PREFIX) -> str:
    """The environment variable that supplies the default of field `name`."""
    return prefix + name.upper()


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
    convert: Callable[[str], Any]
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


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def add_config_args(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    title: str | None = None,
    skip: Collection[str] = (),
    only_given: bool = False,
) -> argparse.ArgumentParser:
    """Adds one `--field-name` flag per field of the dataclass `cls` (except those in `skip`).

    Defaults come from `<env_prefix><FIELD>` when set, else from the dataclass. Help comes from
    `field(metadata={"help": ...})`; a help text that already says what its default means is not
    followed by the raw default. Bools get `--x/--no-x`; other `X | None` fields accept `none`.
    With `title`, the flags get their own section of the help. With `only_given`, the namespace
    gets only the flags given on the command line (no defaults, no environment): `nanoserve serve`
    forwards those to the service, which reads the rest itself.
    """
    prefix = env_prefix(cls)
    section = parser.add_argument_group(title) if title else parser
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        base, optional = _unwrap_optional(hints[f.name])
        convert = _converter(base, optional)
        default: Any
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        env = os.environ.get(env_var(f.name, prefix))
        if env is not None and not only_given:
            try:
                default = convert(env)
            except argparse.ArgumentTypeError as e:
                parser.error(f"{env_var(f.name, prefix)}: {e}")
        help_text = f.metadata.get("help", "")
        if default is dataclasses.MISSING:
            suffix = "required"
        elif "default" in help_text:
            suffix = ""
        else:
            suffix = f"default: {_shown(default)}"
        notes = "; ".join(s for s in (suffix, f"env {env_var(f.name, prefix)}") if s)
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "help": f"{help_text} ({notes})".lstrip().replace("%", "%%"),
        }
        # A missing required flag is reported by config_from_args in one line, not by argparse
        # (whose message comes after the whole usage synopsis).
        kwargs["default"] = (
            argparse.SUPPRESS if only_given or default is dataclasses.MISSING else default
        )
        if base is bool:  # one style for every boolean: --x / --no-x (unset: the default or None)
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = convert
            kwargs["metavar"] = getattr(base, "__name__", "VALUE").upper()
        section.add_argument(flag(f.name), **kwargs)
    return parser


def config_argv(values: dict[str, Any], cls: type | None = None) -> list[str]:
    """The flags that make a config parser produce `values` (field name -> parsed value); with
    `cls`, an unset (None) `bool | None` field is left out (`--x/--no-x` cannot spell it)."""
    argv: list[str] = []
    hints = typing.get_type_hints(cls) if cls is not None else {}
    for name, value in values.items():
        if value is None and name in hints and _unwrap_optional(hints[name])[0] is bool:
            continue  # `--x/--no-x` has no spelling for "unset": leave the flag out
        if isinstance(value, bool):
            argv.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag(name), _shown(value)]
    return argv


def config_from_args(cls: type[T], namespace: argparse.Namespace) -> T:
    """Builds `cls` from the parsed flags; a required flag that is missing, or the dataclass's
    __post_init__, raises ValueError."""
    prefix = env_prefix(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if hasattr(namespace, f.name):
            values[f.name] = getattr(namespace, f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            what = f.metadata.get("help", "")
            raise ValueError(
                f"{flag(f.name)} is required"
                + (f": {what}" if what else "")
                + f" (or set {env_var(f.name, prefix)})"
            )
    return cls(**values)


def parse_config(
    cls: type[T],
    argv: Sequence[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
    prog: str | None = None,
) -> T:
    """Parses `argv` into `cls`; a validation ValueError becomes one line on stderr and exit 2.

    `prog` names the command in usage lines (`python -m nanoserve.worker`, `nanoserve worker`).
    """
    if parser is None:
        doc = cls.__doc__ or ""
        # dataclass() fills a missing docstring with the signature, which is no description.
        parser = argparse.ArgumentParser(
            prog=prog, description=None if doc.startswith(cls.__name__ + "(") else doc
        )
    add_config_args(parser, cls)
    namespace = parser.parse_args(argv)
    try:
        return config_from_args(cls, namespace)
    except ValueError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
