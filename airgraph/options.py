"""How an option is declared, validated and grouped: ``Option`` and ``OptionGroup``, the machinery under
airgraph/config.py. config.py declares every option and is the one reader of the environment: it hands the groups
``os.environ``, and nothing here reads more than the mapping it is given."""

from __future__ import annotations

import copy
import difflib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["Option", "OptionGroup", "truthy"]

_NO_ENVIRONMENT: Mapping[str, str] = MappingProxyType({})


class Option:
    """One declared option: a default, a one-line doc, and what values it accepts."""

    def __init__(
        self,
        default: Any,
        doc: str,
        *,
        choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None,
        types: type | tuple[type, ...] | None = None,
        check: Callable[[Any], str | None] | None = None,
        allowed: str | None = None,
        env: str | None = None,
        normalize: Callable[[Any], Any] | None = None,
        minimum: int | None = None,
    ) -> None:
        """``normalize`` maps an accepted spelling to the stored value before validation (an environment string,
        a seed's alias such as AOE's "2" for "op"). ``minimum``: an int option's least value (None passes where
        the types allow it), its ``check`` and ``allowed`` text both."""
        self.doc = doc
        self.normalize = normalize
        self._choices = choices
        kinds = types if types is not None or choices is not None else type(default)
        self.types: tuple[Any, ...] = kinds if isinstance(kinds, tuple) else (kinds,)
        if minimum is not None:

            def check(value: int | None) -> str | None:
                return None if value is None or value >= minimum else f"must be >= {minimum}"

            allowed = f"an int >= {minimum}" + (" or None" if type(None) in self.types else "")
        self.check = check
        self.allowed = allowed
        self.env = env
        self.name = "?"
        self.default = default

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The allowed values, or None; a callable is asked each time (a registry that lists them)."""
        return self._choices() if callable(self._choices) else self._choices

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def describe_allowed(self) -> str:
        if self.choices is not None:
            return ", ".join(repr(c) for c in self.choices)
        if self.allowed is not None:
            return self.allowed
        return " or ".join("None" if k is type(None) else k.__name__ for k in self.types)

    def validate(self, path: str, value: Any) -> Any:
        def bad(reason: str = "") -> ValueError:
            extra = f" ({reason})" if reason else ""
            return ValueError(
                f"{path}: invalid value {value!r}{extra}; allowed values: {self.describe_allowed()}. {self.doc}"
            )

        if self.normalize is not None:
            try:
                value = self.normalize(value)
            except (TypeError, ValueError) as exc:
                raise bad(str(exc)) from None

        if self.choices is not None:
            if value not in self.choices:
                raise bad()
            return value
        # bool is an int subclass: an int option must not take True, a bool option must not take 1.
        if isinstance(value, bool) and bool not in self.types:
            raise bad("a bool is not accepted here")
        if not isinstance(value, self.types):
            raise bad(f"got {type(value).__name__}")
        if self.check is not None:
            reason = self.check(value)
            if reason:
                raise bad(reason)
        return value

    def initial(self, environ: Mapping[str, str]) -> Any:
        """The value a new group starts with: ``environ[env]`` where set (parsed for a bool or int option), else a
        copy of the default."""
        if self.env is not None and self.env in environ:
            raw = environ[self.env]
            value: Any = raw
            if bool in self.types:
                value = truthy(raw)
            elif int in self.types:
                try:
                    value = int(raw)
                except ValueError:
                    raise ValueError(
                        f"environment variable {self.env}={raw!r} is not an integer; unset it or give an integer. "
                        f"{self.doc}"
                    ) from None
            return value
        return copy.deepcopy(self.default)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def truthy(raw: str) -> bool:
    """An environment variable's boolean: 1, true, yes or on (any case)."""
    return raw.strip().lower() in ("1", "true", "yes", "on")


class OptionGroup:
    """A group of options and nested groups; subclasses declare them as class attributes. ``environ``: where
    options with an ``env`` variable start from (airgraph.config's CompilerConfig gives ``os.environ``)."""

    _path = "CompilerConfig"

    def __init__(self, path: str | None = None, environ: Mapping[str, str] = _NO_ENVIRONMENT) -> None:
        object.__setattr__(self, "_path", path or type(self)._path)
        object.__setattr__(self, "_values", {})
        for name, opt in self._options().items():
            value = opt.initial(environ)
            self._values[name] = opt.validate(f"{self._path}.{name}", value)
        for name, group_cls in self._groups().items():
            object.__setattr__(self, name, group_cls(f"{self._path}.{name}", environ))

    @classmethod
    def _options(cls) -> dict[str, Option]:
        return {n: v for k in reversed(cls.__mro__) for n, v in vars(k).items() if isinstance(v, Option)}

    @classmethod
    def _groups(cls) -> dict[str, type[OptionGroup]]:
        return {
            n: v
            for k in reversed(cls.__mro__)
            for n, v in vars(k).items()
            if isinstance(v, type) and issubclass(v, OptionGroup) and not n.startswith("_")
        }

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            values = object.__getattribute__(self, "_values")
            if name in values:
                return values[name]
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(self._unknown(name))

    def __setattr__(self, name: str, value: Any) -> None:
        options = self._options()
        if name in options:
            self._values[name] = options[name].validate(f"{self._path}.{name}", value)
            return
        if name in self._groups():
            raise AttributeError(f"{self._path}.{name} is an option group; set its options instead")
        raise AttributeError(self._unknown(name))

    def _unknown(self, name: str) -> str:
        known = sorted([*self._options(), *self._groups()])
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{self._path} has no option {name!r}{hint} Known: {', '.join(known)}"

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for name in self._options():
            yield name, self._values[name]
        for name in self._groups():
            yield name, getattr(self, name)

    def as_dict(self) -> dict[str, Any]:
        """All options as a nested plain dict (groups become dicts)."""
        return {name: value.as_dict() if isinstance(value, OptionGroup) else value for name, value in self}

    def to_dict(self) -> dict[str, Any]:
        """All options as a nested dict of JSON values (tuples become lists): what :meth:`to_file` writes."""
        return _plain(self.as_dict())

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> OptionGroup:
        """A new group (its defaults and environment as ``cls()`` gives them) with ``values`` set over them, each
        validated as an assignment is."""
        group = cls()
        group.update(values)
        return group

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as a JSON file, atomically (a reader never sees half of it)."""
        from airgraph.store import write_text_atomic

        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", durable=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> OptionGroup:
        """A new group with a JSON file's options set over its defaults (see :meth:`load_file`)."""
        group = cls()
        group.load_file(path)
        return group

    def load_file(self, path: str | os.PathLike[str]) -> None:
        """Set the options a JSON file (as :meth:`to_file` writes) names; an unreadable file, a wrong value or an
        unknown key raises ``ValueError`` naming the file, the key and the allowed values or known keys."""
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except OSError as exc:
            raise ValueError(f"config file {os.fspath(path)}: cannot be read ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"config file {os.fspath(path)}: not JSON ({exc})") from None
        if not isinstance(values, dict):
            raise ValueError(f"config file {os.fspath(path)}: expected a JSON object of options, not {values!r}")
        try:
            self.update(values)
        except (AttributeError, ValueError) as exc:
            raise ValueError(f"config file {os.fspath(path)}: {exc}") from None

    def update(self, values: dict[str, Any]) -> None:
        """Set options from a nested dict, validating each one (the inverse of ``as_dict``)."""
        for name, value in values.items():
            if name in self._groups():
                if not isinstance(value, dict):
                    raise ValueError(f"{self._path}.{name} is an option group; give it a dict, not {value!r}")
                getattr(self, name).update(value)
            else:
                setattr(self, name, value)

    def describe(self) -> dict[str, str]:
        """Flat ``{"group.option": doc}`` of every option, for help texts and docs."""
        out: dict[str, str] = {}
        for name, opt in self._options().items():
            out[name] = f"{opt.doc} Allowed: {opt.describe_allowed()}. Default: {opt.default!r}."
        for name in self._groups():
            for sub, doc in getattr(self, name).describe().items():
                out[f"{name}.{sub}"] = doc
        return out

    def __deepcopy__(self, memo: dict) -> OptionGroup:
        # every attribute: the values, the sub-groups and whatever a subclass keeps beside them (the torchair
        # CompilerConfig keeps aoe_config_file's path there)
        new = object.__new__(type(self))
        memo[id(self)] = new
        for name, value in vars(self).items():
            object.__setattr__(new, name, copy.deepcopy(value, memo))
        return new

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        def fmt(group: OptionGroup, indent: int) -> Iterator[str]:
            for name, value in group:
                if isinstance(value, OptionGroup):
                    yield " " * indent + f"{name}:"
                    yield from fmt(value, indent + 2)
                else:
                    yield " " * indent + f"{name} = {value!r}"

        return "\n".join([f"{type(self).__name__}(", *fmt(self, 2), ")"])
