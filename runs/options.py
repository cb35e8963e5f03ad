"""Command-line options declared once, on the typed config they fill.

A config field made with `option(...)` carries its help text and value type; `add_options` turns the
fields of a dataclass into argparse flags (`--budget` for `budget`, plus any aliases), with the default
shown in `--help`, and `collect` builds the dataclass back from the parsed namespace. Every command line
of Sangam (the `sangam` subcommands) derives its flags this way, so an option is declared in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
META = "sangam.option"


@dataclass(frozen=True, slots=True)
class Option:
    """How one config field appears on the command line."""

    help: str
    parse: Callable[[str], Any] | None = None  # None: str, or the enum / Path / bool of the default
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    many: bool = False  # takes one or more values, repeatable (`--qps 6 7 --qps 8`)
    default_text: str | None = None  # what `--help` says of a None default
    bare: Any = None  # not None: the value may be left out, and the flag alone means this (`--ray`)


def option(
    default: Any,
    help: str,
    *,
    parse: Callable[[str], Any] | None = None,
    aliases: Iterable[str] = (),
    choices: Iterable[str] | None = None,
    metavar: str | None = None,
    many: bool = False,
    default_text: str | None = None,
    bare: Any = None,
) -> Any:
    """A dataclass field with its command-line flag."""
    spec = Option(
        help,
        parse,
        tuple(aliases),
        tuple(choices) if choices is not None else None,
        metavar,
        many,
        default_text,
        bare,
    )
    return dataclasses.field(default=default, metadata={META: spec})


def nonempty_path(text: str) -> Path:
    """A path given on the command line; an empty one is refused (it would mean the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The fields of `cls` that are options, in declaration order."""
    return [(f, f.metadata[META]) for f in dataclasses.fields(cls) if META in f.metadata]


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    single: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    default_text: Mapping[str, str] | None = None,
) -> None:
    """Add a flag for the option fields of `cls` (`only` these, none of `skip`); `single` makes `many`
    options take one value; `defaults` and `default_text` replace a field's default (and what `--help`
    says of it) for this command."""
    wanted = set(only) if only is not None else None
    skipped = set(skip)
    one = set(single)
    defaults = defaults or {}
    default_text = default_text or {}
    for f, spec in declared(cls):
        if f.name in skipped or (wanted is not None and f.name not in wanted):
            continue
        default = defaults.get(f.name, f.default)
        text = default_text.get(f.name, spec.default_text)
        names = [flag(f.name), *spec.aliases]
        if isinstance(default, bool):
            action = argparse.BooleanOptionalAction if default else "store_true"
            parser.add_argument(*names, dest=f.name, action=action, default=default, help=spec.help)
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "help": _help(spec.help, default, text)}
        kwargs["type"] = spec.parse or _parser_for(default)
        if spec.choices is not None:
            kwargs["choices"] = spec.choices
        elif isinstance(default, enum.Enum):
            kwargs["choices"] = [m for m in type(default)]
            kwargs["metavar"] = "{" + ",".join(str(m.value) for m in type(default)) + "}"
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        if spec.many and f.name in one:
            kwargs.update(type=lambda text, p=kwargs["type"], n=f.name: _one(p(text), n), default=default)
        elif spec.many:
            kwargs.update(nargs="+", action="extend", default=None)
        elif spec.bare is not None:
            kwargs.update(nargs="?", const=spec.bare, default=default)
        else:
            kwargs["default"] = default
        parser.add_argument(*names, **kwargs)


def _one(values: list[Any], name: str) -> Any:
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"{flag(name)} takes one value here")
    return values[0]


def _parser_for(default: Any) -> Callable[[str], Any]:
    if isinstance(default, enum.Enum):
        kind = type(default)

        def member(text: str) -> Any:
            try:
                return kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"invalid choice: {text!r}") from None

        return member
    if isinstance(default, Path):
        return nonempty_path
    return str


def _help(text: str, default: Any, default_text: str | None) -> str:
    """`text` with the default appended (argparse expands `%`, so the default's are doubled)."""
    if default_text is None and default is None:
        return text
    shown = default_text if default_text is not None else default
    shown = shown.value if isinstance(shown, enum.Enum) else shown
    return f"{text} (default: {str(shown).replace('%', '%%')})"


def collect(cls: type[T], args: argparse.Namespace, **fixed: Any) -> T:
    """`cls` built from the parsed flags of its option fields (absent ones keep their default) and the
    `fixed` values, which take the place of flags (a `many` option's list is given one value at a time)."""
    values: dict[str, Any] = {}
    for f, spec in declared(cls):
        if f.name in fixed or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        many = spec.many and (value is None or isinstance(value, list))  # not made `single` for this command
        values[f.name] = listed(args, f.name, f.default) if many else value
    values.update(fixed)
    return cls(**values)


def listed(args: argparse.Namespace, name: str, default: Any) -> tuple[Any, ...]:
    """The values of a `many` option, flattened (`--qps 6,7 --qps 8`), `(default,)` when absent (a tuple
    default as it is); a value given twice is a ValueError."""
    given = getattr(args, name, None)
    if given is None:
        values = default if isinstance(default, tuple) else (default,)  # a tuple default is the list itself
    else:
        values = tuple(_flatten(given))
    seen: dict[Any, Any] = {}  # by how a value is shown: a float's also names its results (qps-1/)
    for value in values:
        shown = f"{value:g}" if isinstance(value, float) else value
        if shown in seen:
            same = (
                "twice"
                if seen[shown] == value
                else f"twice ({seen[shown]!r} and {value!r} both show as {shown})"
            )
            raise ValueError(f"{flag(name)} lists {shown} {same}")
        seen[shown] = value
    return values


def _flatten(values: Iterable[Any]) -> Iterable[Any]:
    for value in values:
        if isinstance(value, list | tuple):
            yield from value
        else:
            yield value
