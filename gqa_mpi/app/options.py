"""The command line of :class:`~gqa_mpi.config.config.Config`: one option per field, in
its group, with the field's docstring and real default as help (so the help, a study's
config file and the library API take the same names)."""
from __future__ import annotations

import argparse
import ast
import functools
import inspect
from dataclasses import fields
from typing import Dict, List, Literal, Optional, get_args, get_origin, get_type_hints

from ..config.config import Config

GROUPS = {
    "common": "the options most runs use (C x P must equal the number of MPI ranks)",
    "layout": "layout (C x P must equal the number of MPI ranks)",
    "problem": "problem (generated unless --inputs is given)",
    "algorithm": "algorithm",
    "outputs": "outputs and run control",
}


def argument_type(parse):
    """``parse`` (which raises ValueError) as an argparse type, whose message argparse
    prints as it stands."""
    def read(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    read.__name__ = getattr(parse, "__name__", "value")
    return read


@functools.lru_cache(maxsize=None)
def field_docs() -> Dict[str, str]:
    """Each field's docstring (the string right below it in :class:`Config`)."""
    try:
        tree = ast.parse(inspect.getsource(Config))
    except (OSError, TypeError):  # no source (a frozen build): no help text
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _shown(f) -> str:
    shown = f.metadata.get("shown")
    if shown is not None:
        return shown
    if isinstance(f.default, bool):
        return "on" if f.default else "off"
    return f.metadata["format"](f.default) if f.default is not None else "none"


def add_arguments(parser: argparse.ArgumentParser, names: Optional[List[str]] = None,
                  shown: Optional[Dict[str, object]] = None,
                  common_first: bool = False) -> None:
    """Add one option per :class:`Config` field (or per field in ``names``) to ``parser``,
    in its group, with the field's docstring and real default as help; with
    ``common_first``, the fields most runs use (their ``common`` metadata) come first in
    a group of their own and the rest follow as advanced options.

    Options left out of the command line are absent from the namespace
    (``argparse.SUPPRESS``), so ``Config(**vars(namespace))`` takes the dataclass
    defaults and the caller can tell what was given. ``shown`` overrides the defaults
    the help prints (a study's own, say).
    """
    hints = get_type_hints(Config)
    docs = field_docs()
    shown = shown or {}
    sections: Dict[str, argparse._ArgumentGroup] = {}
    for f in fields(Config):
        if names is not None and f.name not in names:
            continue
        group = "common" if common_first and f.metadata["common"] else f.metadata["group"]
        if group not in sections:
            title = GROUPS[group]
            if common_first and group != "common":
                title = "advanced: " + title.split(" (")[0]
            sections[group] = parser.add_argument_group(title)
        kind = hints[f.name]
        if get_origin(kind) is not Literal and type(None) in get_args(kind):
            kind = next(a for a in get_args(kind) if a is not type(None))
        default = shown[f.name] if f.name in shown else _shown(f)
        text = docs.get(f.name, "")
        registry = f.metadata.get("choices")
        if registry is not None:
            text += ": " + "; ".join(f"{x.name} = {x.help}" for x in registry)
        kw = dict(default=argparse.SUPPRESS,
                  help=f"{text} (default: {default})".replace("%", "%%"))
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
        else:
            kw["metavar"] = f.metadata.get("metavar")
            if get_origin(kind) is Literal:
                kw["choices"] = list(get_args(kind))
            elif registry is not None:
                kw["choices"] = registry.names(aliases=True)
            parse = f.metadata.get("parse")
            kw["type"] = argument_type(parse) if parse else (kind if kind in (int, float) else str)
        sections[group].add_argument("--" + f.name.replace("_", "-"), **kw)
