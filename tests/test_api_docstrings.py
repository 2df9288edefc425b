"""Every public name of ``trust_oracles`` (its ``__all__``) has a numpydoc docstring, the text the
API reference page (docs/PUBLIC_API.md, the docs site) renders: a function or method that takes
values has a Parameters section and one that returns a value a Returns section; a class with
fields an Attributes (or Parameters) section; a constant or type alias the docstring below its
assignment that griffe reads.  Also: the package ships its py.typed marker (PEP 561)."""
from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import trust_oracles
from conftest import ROOT

SECTION = "{}\n{}"


def _has(doc: str, *titles: str) -> bool:
    lines = [line.strip() for line in doc.splitlines()]
    return any(a == t and b and set(b) == {"-"} for a, b in zip(lines, lines[1:]) for t in titles)


def _own_doc(obj) -> str:
    doc = obj.__doc__ or ""
    # a dataclass without a docstring gets its signature as __doc__
    return "" if doc.startswith(f"{getattr(obj, '__name__', '')}(") else inspect.cleandoc(doc)


def _function_problems(name: str, fn, method: bool = False) -> list[str]:
    doc = _own_doc(fn)
    if not doc:
        return [f"{name}: no docstring"]
    out = []
    sig = inspect.signature(fn)
    params = [p for i, p in enumerate(sig.parameters.values()) if not (method and i == 0)]
    if params and not _has(doc, "Parameters"):
        out.append(f"{name}: takes {[p.name for p in params]} but has no Parameters section")
    returns = sig.return_annotation
    if returns not in (inspect.Signature.empty, None, "None") and \
            not _has(doc, "Returns", "Yields"):
        out.append(f"{name}: returns {returns} but has no Returns section")
    return out


def _attribute_docstring(obj_name: str, module) -> str | None:
    """The string literal right below ``obj_name = ...`` at the top of ``module`` (griffe's
    attribute docstring)."""
    body = ast.parse(Path(inspect.getsourcefile(module)).read_text()).body
    for node, after in zip(body, body[1:]):
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        if obj_name in targets and isinstance(after, ast.Expr) and \
                isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            return after.value.value
    return None


def problems(name: str) -> list[str]:
    obj = getattr(trust_oracles, name)
    module = inspect.getmodule(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else \
        __import__(f"trust_oracles.{trust_oracles._WHERE[name]}", fromlist=["_"])
    if inspect.isfunction(obj):
        return _function_problems(name, obj)
    if not inspect.isclass(obj):              # a constant or a type alias
        doc = _attribute_docstring(name, module)
        return [] if doc and doc.strip() else [f"{name}: no docstring below its assignment in "
                                                f"{module.__name__}"]
    doc = _own_doc(obj)
    if not doc:
        return [f"{name}: no docstring of its own"]
    if issubclass(obj, BaseException):
        return []
    out = []
    fields = getattr(obj, "__dataclass_fields__", {})
    if fields and not _has(doc, "Attributes", "Parameters"):
        out.append(f"{name}: fields {list(fields)} but no Attributes section")
    for attr, value in vars(obj).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, property):
            if not _own_doc(value.fget):
                out.append(f"{name}.{attr}: a property without a docstring")
        elif isinstance(value, (classmethod, staticmethod)):
            out += _function_problems(f"{name}.{attr}", value.__func__,
                                      method=isinstance(value, classmethod))
        elif inspect.isfunction(value):
            out += _function_problems(f"{name}.{attr}", value, method=True)
    return out


@pytest.mark.parametrize("name", trust_oracles.__all__)
def test_every_public_name_has_a_numpydoc_docstring(name):
    found = problems(name)
    assert not found, "\n".join(found)


def test_the_section_check_reads_numpydoc():
    assert _has("Text.\n\nParameters\n----------\nx : int\n", "Parameters")
    assert not _has("Parameters: x, y", "Parameters")


def test_the_package_is_typed():
    assert (ROOT / "trust_oracles" / "py.typed").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert 'trust_oracles = ["py.typed"]' in text, "py.typed is not package data: it does not ship"
