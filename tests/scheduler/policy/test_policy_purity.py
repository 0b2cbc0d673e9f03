"""The policy package stays pure: no RPC, database, event loop or wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduler.policy

FORBIDDEN = {"grpc", "sqlalchemy", "asyncio", "time", "datetime", "aiosqlite", "asyncpg"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_of_the_policy_package_imports_io_or_clocks() -> None:
    package = Path(scheduler.policy.__file__).parent
    modules = sorted(package.rglob("*.py"))
    assert len(modules) >= 5
    offenders = {p.name: sorted(_imports(p) & FORBIDDEN) for p in modules}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_policy_modules_import_only_the_stdlib_and_the_policy_package() -> None:
    package = Path(scheduler.policy.__file__).parent
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scheduler"):
                assert node.module.startswith("scheduler.policy"), f"{path.name} imports {node.module}"
