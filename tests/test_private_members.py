"""No module in ``src/`` touches another's private members.

A name with one leading underscore is its module's own. This walks every module of
``lmsp`` and finds each ``x._name`` whose ``x`` is not ``self``, ``cls`` or ``super()``.
Such an access is allowed only when the module itself defines ``_name`` (a method, a
class attribute or an attribute it assigns on ``self``): one instance of a module's own
class touching another's (a classmethod building one, a connection evicting another).
Anything else reaches into another module, or a library, and is listed in
:data:`ALLOWED`, with the reason, or fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmsp

SRC = Path(lmsp.__file__).parent

#: (module, the access as written): why it is allowed
ALLOWED = {
    # the standard library's exit without clean-up: public, despite its name
    ("engines/worker.py", "os._exit"): "public API",
    # httpx's transport takes no network backend, and its pool has no public one: the
    # hosts guard (every outgoing connection checked) has to sit there
    ("outbound/guard.py", "pool._network_backend"): "httpcore internals",
    ("outbound/guard.py", "cast(Any, made)._pool"): "httpx internals",
}


def _own_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, methods, class attributes, and
    attributes it assigns or declares on ``self``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and _own_object(node.value)
        ):
            names.add(node.attr)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if stmt.value is not None:  # a declaration alone defines nothing
                    names.add(stmt.target.id)
            elif isinstance(stmt, ast.Assign):
                names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return {name for name in names if _private(name)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_object(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def reaches(source: str) -> list[tuple[int, str]]:
    """The accesses of ``source`` to private members that are not its own."""
    tree = ast.parse(source)
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if _own_object(node.value) or node.attr in own:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_touches_another_modules_private_members() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for line, access in reaches(path.read_text()):
            if (module, access) not in ALLOWED:
                found.append(f"{module}:{line}: {access}")
    assert not found, "private members of another module:\n" + "\n".join(found)


def test_the_check_sees_what_it_must() -> None:
    """The check itself: another object's private member is caught, a module's own
    (and ``self``'s, ``cls``'s, ``super()``'s) is not."""
    caught = reaches(
        "def f(runner):\n"
        "    runner._cancels.add(1)\n"
        "    return runner.asm._open\n"
        "class P:\n"
        "    _declared: int\n"
    )
    assert [access for _, access in caught] == ["runner._cancels", "runner.asm._open"]
    assert not reaches(
        "class A:\n"
        "    _kind = 1\n"
        "    def __init__(self):\n"
        "        self._open = None\n"
        "    def evict(self, other):\n"
        "        other._open = self._kind\n"
        "        return super()._close(), cls._make()\n"
        "    def _make(self): ...\n"
        "    def _close(self): ...\n"
    )
