"""A name -> object registry: what the command line offers, the config accepts, the
report prints and the study sweeps all come from one of these. No MPI here."""
from __future__ import annotations

from typing import Dict, Generic, List, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects with a ``name`` and a ``help``, in registration order.

    ``flag`` is the option that picks one (``--reduce``), used in error messages.
    """

    def __init__(self, flag: str):
        self.flag = flag
        self._items: Dict[str, T] = {}
        self._aliases: Dict[str, str] = {}

    def register(self, cls):
        """Class decorator: register one instance of ``cls`` under ``cls.name``."""
        obj = cls()
        if obj.name in self._items:
            raise ValueError(f"{self.flag} {obj.name!r} is registered twice")
        self._items[obj.name] = obj
        return cls

    def alias(self, name: str, target: str) -> None:
        """Accept ``name`` for the entry ``target`` (reports show the entry's name)."""
        self._aliases[name] = target

    def names(self, aliases: bool = False) -> List[str]:
        """The entries' names, in registration order (and the aliases, if asked)."""
        return list(self._items) + (list(self._aliases) if aliases else [])

    def get(self, name: str) -> T:
        """The entry called ``name``; ValueError naming the choices otherwise."""
        try:
            return self._items[self._aliases.get(name, name)]
        except (KeyError, TypeError):
            raise ValueError(f"{self.flag} must be one of {', '.join(self._items)}, "
                             f"got {name!r}") from None

    def __contains__(self, name) -> bool:
        return name in self._items or name in self._aliases

    def __iter__(self):
        return iter(self._items.values())
