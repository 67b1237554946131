"""The type verl gives a key of its trainer config, where its YAML does not say: bool, int, float, text or list.

verl's YAML is untyped until its trainer turns each section into a dataclass, inside a Ray worker and long
after `plan`; so a key's type is its default's in verl's own config as the recipe composes it, and a null
default takes the type its section's dataclass declares, read from verl's source with `ast` (verl's modules
import torch, which `plan` never does). Used to refuse a value of the wrong type, and to say which fix of a
sweep works for its key.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence


def select_key(container: Any, key: str) -> tuple[bool, Any]:
    node = container
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _scalar_type(value: Any) -> str | None:
    """The type verl's config gives a key by its default (bool, int, float), or None where any text may do."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def _fits(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: Keys verl's config leaves null and untyped (no dataclass behind their section) that verl and the recipe read
#: as numbers: verl's trainer counts steps with it; the smoke verdict and the progress lines read it back.
RECIPE_READ_KINDS = {"trainer.total_training_steps": "int"}
_KIND_NAMES = {frozenset({"int"}): "int", frozenset({"float"}): "float", frozenset({"int", "float"}): "float",
               frozenset({"bool"}): "bool"}  # fmt: skip


#: Spellings that only say "or None": Optional[X], Union[X, None] (bare or as typing.Optional, t.Union, ...).
_NONE_WRAPPERS = frozenset({"Optional", "Union", "None"})


def _annotation_kind(node: ast.expr) -> str | None:
    """bool, int or float when an annotation allows only that type (and None); None otherwise.

    `int | None`, `Optional[int]`, `Union[int, None]`, `typing.Optional[int]` and their string forms
    are alike: the wrappers and the module they are read from (`typing.`) name no type.
    """
    names: set[str] = set()
    modules = {id(part.value) for part in ast.walk(node) if isinstance(part, ast.Attribute)}
    for part in ast.walk(node):
        if isinstance(part, ast.Attribute):
            names.add(part.attr)
        elif isinstance(part, ast.Name) and id(part) not in modules:
            names.add(part.id)
        elif isinstance(part, ast.Constant) and isinstance(part.value, str):  # a string annotation
            try:
                inner = _annotation_kind(ast.parse(part.value, mode="eval").body)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return None
            if inner is None:
                return None
            names.add(inner)
    return _KIND_NAMES.get(frozenset(names - _NONE_WRAPPERS))


def _module_files(verl_root: Path, module: str) -> list[Path]:
    """The source files of a verl module: a package's files, or the one file."""
    place = verl_root.joinpath(*module.split(".")[1:])
    if place.is_dir():
        return sorted(place.glob("*.py"))
    return [place.with_suffix(".py")] if place.with_suffix(".py").is_file() else []


@lru_cache(maxsize=None)
def _parsed(verl_root: Path, file: Path) -> tuple[dict[str, ast.ClassDef], dict[str, str]]:
    """A file's classes, and the module each name it imports comes from (relative imports resolved)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}, {}
    package = file.parent
    imports: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.parent
                base = ".".join(["verl", *anchor.relative_to(verl_root).parts])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            imports.update({alias.asname or alias.name: module for alias in node.names})
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}, imports


@lru_cache(maxsize=None)
def _dataclass_fields(verl_root: Path, target: str, depth: int = 0) -> dict[str, str | None]:
    """Field -> kind of verl's dataclass `target` (a `_target_` of its config), read from its source with `ast`:
    verl's modules import torch, which `plan` never does. Fields of base classes count too, wherever verl
    defines them (followed through the imports of the class's file)."""
    module, _, name = target.rpartition(".")
    for file in _module_files(verl_root, module):
        classes, imports = _parsed(verl_root, file)
        node = classes.get(name)
        if node is None:
            continue
        found: dict[str, str | None] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and depth < 8:
                where = module if base.id in classes else imports.get(base.id, "")
                if where.startswith("verl"):
                    found.update(_dataclass_fields(verl_root, f"{where}.{base.id}", depth + 1))
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                found[item.target.id] = _annotation_kind(item.annotation)
        return found
    return {}


def _declared_kind(base: Any, key: str, config_dir: Path) -> str | None:
    """The kind of a key whose default is null: the recipe's own reading of it, else its section's dataclass field."""
    if key in RECIPE_READ_KINDS:
        return RECIPE_READ_KINDS[key]
    section, _, field = key.rpartition(".")
    found, target = select_key(base, f"{section}._target_") if section else (False, None)
    if not found or not isinstance(target, str) or not target.startswith("verl."):
        return None
    return _dataclass_fields(config_dir.parents[1], target).get(field)


def value_kind(base: Any, key: str, config_dir: Path) -> str | None:
    """bool, int, float, text or list: what verl reads `key` as in the composed config `base`; None when unknown
    (a key verl's config lacks, a section, a null that no dataclass types)."""
    found, default = select_key(base, key)
    if not found:
        return None
    if isinstance(default, list):
        return "list"
    if isinstance(default, str):
        return "text"
    return _scalar_type(default) if default is not None else _declared_kind(base, key, config_dir)


def type_problems(base: Any, config: Any, extra: Sequence[str], config_dir: Path) -> list[str]:
    """Overrides after `--` that give a bool, int or float key of verl's config a value of another type.

    `base` is verl's config as the recipe composes it, `config` with the overrides, both as containers
    (unresolved). A null default takes the type its section's dataclass declares (read with `ast`), or
    RECIPE_READ_KINDS's, and then null stays allowed. An interpolation is not checked.
    """
    problems = []
    for text in extra:
        key = text.split("=", 1)[0].lstrip("+~")
        found, default = select_key(base, key)
        kind = _scalar_type(default) if found else None
        nullable = found and default is None
        if nullable:
            kind = _declared_kind(base, key, config_dir)
        if kind is None:
            continue
        _, value = select_key(config, key)
        if value is None and nullable:
            continue
        if not (isinstance(value, str) and "${" in value) and not _fits(kind, value):
            problems.append(
                f"override {text!r}: {key} is {'a' if kind != 'int' else 'an'} {kind}{' or null' if nullable else ''} in verl's config (default "
                f"{default!r}), not {value!r}; verl would fail on it only when its trainer starts"
            )
    return problems
