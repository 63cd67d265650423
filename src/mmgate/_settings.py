"""Settings, spelled once: each setting is one field of a frozen model, and its flag, its
``MMGATE_*`` variable and its ``--help`` text are generated from that field.

    port: int = setting(8000, flag="--port", help="port to listen on", ge=0, le=65535)

``add_flags(parser, Model)`` adds the model's flags (nested models too: their fields, grouped
under the nested model's ``title``); ``from_args(args, Model)`` reads them back — the flag when
given, else ``MMGATE_<FLAG>``, else the field's default — and validates. A bad value raises
``ConfigError`` naming the flag. Shared by the three programs (gateway, ``sim``, ``bench``).

A TOML file (``values_from_file``) is the layer below the environment: a flag wins over its
variable, which wins over the file, which wins over the default. The file names a flagged
setting by its flag (``max-image-bytes = 1048576``, in the flag's units) and any setting, flagged
or not, by its field in its model's table (``[media] decode_workers = 2``): settings an operator
rarely changes have no flag, only a field the file can set.
"""

from __future__ import annotations

import argparse
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mmgate._env import env_bool, env_list, env_name, env_value
from mmgate.errors import ConfigError as ConfigError  # re-exported: the settings' error

MiB = 1024 * 1024
GiB = 1024 * MiB

M = TypeVar("M", bound=BaseModel)


class Frozen(BaseModel):
    """Base of every settings model: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def setting(
    default: Any = ..., *, flag: str | None = None, help: str = "", metavar: str | None = None,
    scale: int | None = None, group: str | None = None, advanced: bool = False, **constraints: Any,
) -> Any:
    """A settings field; with ``flag`` also a command-line flag and an ``MMGATE_*`` variable.

    ``scale``: the flag is in larger units than the field (``--image-cache-mb`` → bytes).
    ``group``: the ``--help`` section (default: the model's ``title``).
    ``advanced``: a bound or tuning an operator rarely changes: its flag works and has its
    variable, but ``--help`` leaves it to ``--help-all`` (vLLM's ``--help=all`` pattern).
    """
    extra = {k: v for k, v in (("flag", flag), ("metavar", metavar), ("scale", scale), ("group", group),
                               ("advanced", advanced or None)) if v is not None}
    if "default_factory" in constraints:
        return Field(description=help or None, json_schema_extra=cast(Any, extra), **constraints)
    return Field(default, description=help or None, json_schema_extra=cast(Any, extra), **constraints)


def _opt(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def optional(text: str) -> Any:
        return None if text == "" else convert(text)

    optional.__name__ = convert.__name__  # argparse names the type in its error
    return optional


@dataclass(frozen=True, slots=True)
class Flag:
    """One generated flag: where its value goes (``path`` of field names) and how it is read."""

    path: tuple[str, ...]
    flag: str
    kind: Literal["switch", "list", "value"]
    help: str
    default: Any
    required: bool = False
    negated: bool = False  # a ``--no-...`` switch of a field that defaults to True
    convert: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    scale: int | None = None
    group: str | None = None
    advanced: bool = False

    @property
    def dest(self) -> str:
        return "__".join(self.path)


def _kind(annotation: Any) -> tuple[str, Callable[[str], Any] | None, tuple[Any, ...] | None]:
    args = get_args(annotation)
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    if optional:
        annotation = next(a for a in args if a is not type(None))
    if annotation is bool:
        return "switch", None, None
    if get_origin(annotation) is tuple:
        return "list", None, None
    if get_origin(annotation) is Literal:
        return "value", None, get_args(annotation)
    if annotation in (int, float):
        return "value", _opt(annotation) if optional else annotation, None
    return "value", None, None


def flags_of(model: type[BaseModel], *, prefix: str = "", only: tuple[str, ...] | None = None,
             path: tuple[str, ...] = (), group: str | None = None) -> list[Flag]:
    """The flags a model defines, nested models included (``prefix`` renames ``--x`` → ``--<prefix>x``)."""
    group = model.model_config.get("title") or group
    out: list[Flag] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.extend(flags_of(annotation, prefix=prefix, only=only, path=(*path, name), group=group))
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = cast(str | None, extra.get("flag"))
        if flag is None or (only is not None and name not in only):
            continue
        if prefix:
            flag = prefix + flag.removeprefix("--")
        kind, convert, choices = _kind(annotation)
        scale = cast(int | None, extra.get("scale"))
        if scale is not None:
            convert = float
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        negated = kind == "switch" and default is True
        if negated and not flag.startswith("--no-"):
            raise TypeError(f"{model.__name__}.{name}: a switch that defaults to True needs a --no- flag")
        out.append(Flag(
            path=(*path, name), flag=flag, kind=cast(Any, kind), help=info.description or "", default=default,
            required=info.is_required(), negated=negated, convert=convert, choices=choices,
            metavar=cast(str | None, extra.get("metavar")), scale=scale,
            group=cast(str | None, extra.get("group")) or group, advanced=bool(extra.get("advanced")),
        ))
    return out


def _shown(f: Flag) -> str:
    value = f.default
    if f.kind == "switch" or value is None or value == "" or value == ():
        return ""
    if f.scale is not None:
        value = f"{value / f.scale:g}"
    elif isinstance(value, tuple):
        value = ", ".join(str(v) for v in value)
    elif isinstance(value, float):
        value = f"{value:g}"
    return f"default {value}; "


def help_text(f: Flag) -> str:
    """The flag's ``--help`` line: its description, its default and its variable."""
    text = f.help + " " if f.help else ""
    return (text + f"({_shown(f)}env {env_name(f.flag)})").replace("%", "%%")


def add_flags(parser: Any, model: type[BaseModel], *, prefix: str = "",
              only: tuple[str, ...] | None = None, show_advanced: bool = True) -> list[Flag]:
    """Add a model's flags to ``parser``; returns them (for ``from_args``). ``show_advanced``
    False: advanced flags, and the undo twin of every ``--no-`` switch, work but are not listed."""
    flags = flags_of(model, prefix=prefix, only=only)
    groups: dict[str, Any] = {}
    for f in flags:
        hidden = not show_advanced and f.advanced
        target: Any = parser
        if f.group is not None:
            if f.group not in groups:
                groups[f.group] = parser.add_argument_group(f.group)
            target = groups[f.group]
        shown = argparse.SUPPRESS if hidden else help_text(f)
        if f.kind == "switch" and f.negated:
            target.add_argument("--" + f.flag.removeprefix("--no-"), dest=f.dest, action="store_true",
                                default=None, help=argparse.SUPPRESS if not show_advanced else f"undo {f.flag}")
            target.add_argument(f.flag, dest=f.dest, action="store_false", default=None, help=shown)
        elif f.kind == "switch":
            target.add_argument(f.flag, dest=f.dest, action="store_true", default=None, help=shown)
        else:
            target.add_argument(
                f.flag, dest=f.dest, action="append" if f.kind == "list" else "store", default=None,
                type=f.convert, choices=f.choices, help=shown,
                metavar=f.metavar or (None if f.choices else f.flag.removeprefix("--").replace("-", "_").upper()),
                required=f.required and env_value(f.flag) is None,
            )
    return flags


def _from_env(f: Flag) -> Any:
    if f.kind == "switch":
        try:
            value = env_bool(f.flag)
        except ValueError as exc:
            raise ConfigError(f.flag, str(exc)) from exc
        return None if value is None else value != f.negated
    if f.kind == "list":
        return env_list(f.flag) or None
    raw = env_value(f.flag)
    if raw is None or f.convert is None:
        return raw
    try:
        return f.convert(raw)
    except ValueError as exc:
        raise ConfigError(f.flag, f"{env_name(f.flag)}={raw!r} is not a valid {f.convert.__name__}") from exc


def values_from_args(args: argparse.Namespace, flags: list[Flag]) -> dict[str, Any]:
    """The values given by flag or variable, nested like the model (unset ones left out)."""
    values: dict[str, Any] = {}
    for f in flags:
        value: Any = getattr(args, f.dest, None)
        if value is None:
            value = _from_env(f)
        if value is None:
            continue
        if f.kind == "list":
            value = tuple(value)
        if f.scale is not None:
            value = int(value * f.scale)
        node = values
        for part in f.path[:-1]:
            node = node.setdefault(part, {})
        node[f.path[-1]] = value
    return values


def flag_for(model: type[BaseModel], loc: tuple[Any, ...], *, prefix: str = "", fallback: str = "") -> str:
    """The flag the user can change for a validation error at ``loc`` (a field path)."""
    current: type[BaseModel] = model
    for part in loc:
        info = current.model_fields.get(str(part))
        if info is None:
            break
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = cast(str | None, extra.get("flag")) or "--" + str(part).replace("_", "-")
        return prefix + flag.removeprefix("--") if prefix else flag
    return fallback or model.__name__


def validate(model: type[M], values: Mapping[str, Any], *, prefix: str = "", fallback: str = "") -> M:
    """``model`` built from ``values``; a validation error becomes ``ConfigError`` naming the flag."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        name = flag_for(model, loc, prefix=prefix, fallback=fallback)
        where = ".".join(str(part) for part in loc)
        message = str(err.get("msg", exc))
        raise ConfigError(name, f"{where}: {message}" if where and not name.startswith("--") else message) from exc


def build(model: type[M], **values: Any) -> M:
    """``validate`` with keyword values (tests, and code that builds settings by hand)."""
    return validate(model, values)


def from_args(args: argparse.Namespace, model: type[M], flags: list[Flag], *, prefix: str = "",
              fallback: str = "", **extra: Any) -> M:
    """The model from parsed flags, variables and defaults, plus ``extra`` values; validated."""
    values = values_from_args(args, flags)
    values.update(extra)
    return validate(model, values, prefix=prefix, fallback=fallback)


def values_from_file(
    path: str, model: type[BaseModel], flags: list[Flag], *, source: str = "--config",
    others: frozenset[str] | None = frozenset(),
) -> dict[str, Any]:
    """The values a TOML file gives, nested like the model; ``ConfigError`` naming ``source``
    (and the file) for a file that cannot be read or a key that is no setting. ``others``: keys
    another model of the same program reads from the file (skipped); None: skip every key that is
    not one of ``flags``."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(source, f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"{path} is not valid TOML: {exc}") from exc
    if not data:  # empty, or comments only: a file cut short, read as "every setting at its default"
        raise ConfigError(source, f"{path} holds no setting")
    by_flag = {f.flag.removeprefix("--"): f for f in flags}
    values: dict[str, Any] = {}
    for key, value in data.items():
        f = by_flag.get(key)
        if f is not None:
            if f.kind == "list":
                value = tuple(value) if isinstance(value, list) else (value,)
            elif f.negated and isinstance(value, bool):
                value = not value
            elif f.scale is not None and isinstance(value, int | float) and not isinstance(value, bool):
                value = int(value * f.scale)
            node = values
            for part in f.path[:-1]:
                node = node.setdefault(part, {})
            node[f.path[-1]] = value
        elif others is None or key in others:
            continue
        elif key in model.model_fields:
            values[key] = merged(values.get(key), value) if isinstance(value, dict) else value
        else:
            raise ConfigError(source, f"{path}: {key!r} is not a setting (a flag without its dashes, "
                                       "or a field of a settings table)")
    return values


def merged(base: Any, top: Any) -> Any:
    """``top`` over ``base``, tables merged key by key (the later layer wins)."""
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for key, value in top.items():
            out[key] = merged(out.get(key), value)
        return out
    return top
