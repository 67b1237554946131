"""The rooms of recipe/ import in one direction: no module reaches itself through its imports.

Every import counts, at the top of a module or inside a function (a late import still ties the
two rooms together), except one under `if TYPE_CHECKING:`, which never runs. The graph is read
with the standard library's `ast` and ordered with `graphlib`, which names a cycle if there is one.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[2] / "recipe"


def _module_name(path: Path) -> str:
    parts = path.relative_to(RECIPE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The recipe modules `tree` imports (a `from recipe.x import y` counts recipe.x.y when that is a module)."""
    found: set[str] = set()
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking_only(node)
               for n in ast.walk(node)}  # fmt: skip
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the recipe modules it imports (itself and its own package left out)."""
    paths = {_module_name(path): path for path in RECIPE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        imported = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {other for other in imported if other in paths and other != name and not name.startswith(other + ".")}
    return graph


def test_no_module_of_recipe_reaches_itself_through_its_imports() -> None:
    graph = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        raise AssertionError(f"import circle: {' imports '.join(reversed(error.args[1]))}") from None
    assert set(order) == set(graph)


def test_plan_imports_only_the_rules_of_cluster() -> None:
    """`plan` runs on every start and must never reach the process management of cluster."""
    graph = import_graph()
    reached, todo = set(), ["recipe.plan"]
    while todo:
        for other in graph[todo.pop()] - reached:
            reached.add(other)
            todo.append(other)
    assert {name for name in reached if name.startswith("recipe.cluster.")} == {"recipe.cluster.rules"}


def test_the_command_line_is_only_the_command_line() -> None:
    """recipe/cli.py holds the parser, the help texts, the dispatch and the program's start; `run` lives in recipe.run."""
    tree = ast.parse((RECIPE / "cli.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined <= {"_Parser", "_parser", "_split_extra", "_cmd_plan", "main", "console_main", "_dispatch"}, defined


def test_only_the_command_line_imports_doctor() -> None:
    """doctor reads the image's facts like plan and the run record do; none of them reaches up into it (issue 41)."""
    outside = {
        _module_name(path): sorted(name for name in _imports(ast.parse(path.read_text()), _module_name(path),
                                                              path.name == "__init__.py") if name.startswith("recipe.doctor"))
        for path in RECIPE.rglob("*.py")
        if "doctor" not in path.relative_to(RECIPE).parts and path.name != "cli.py"
    }  # fmt: skip
    assert {module: names for module, names in outside.items() if names} == {}


#: The most lines a room of recipe/ holds (issue 41): past it, it holds two concerns.
MAX_ROOM_LINES = 400


def test_no_room_is_over_400_lines() -> None:
    sizes = {str(path.relative_to(RECIPE)): len(path.read_text().splitlines()) for path in RECIPE.rglob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > MAX_ROOM_LINES} == {}


def _lazy_imports_without_a_reason(path: Path) -> list[str]:
    """Imports inside a function of PATH with no `# lazy:` comment saying why (on the statement, or above its block)."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            own = lines[node.lineno - 1 : node.end_lineno]
            above = node.lineno - 2
            # Walk up over the imports of the same block: one comment may say why for all of them.
            while above >= 0 and lines[above].strip().startswith(("from ", "import ", ")")) or (
                above >= 0 and lines[above].strip().endswith(",")
            ):
                above -= 1
            if not any("lazy:" in line.partition("#")[2] for line in own) and not (
                above >= 0 and "lazy:" in lines[above].partition("#")[2]
            ):
                found.append(f"{path.relative_to(RECIPE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_import_inside_a_function_says_why_it_is_lazy() -> None:
    """A late import hides an arrow between rooms: it is there for start-up time, an optional package or a cycle,
    and a `# lazy:` comment says which (issue 41); anything else belongs at the top of the module."""
    assert [line for path in sorted(RECIPE.rglob("*.py")) for line in _lazy_imports_without_a_reason(path)] == []
