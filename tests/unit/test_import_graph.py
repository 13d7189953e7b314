"""No import cycles among the project's modules, across packages too.

import-linter's ``acyclic_siblings`` contract (``pyproject.toml``) forbids cycles between siblings of
one package (``providers.cloudpool`` <-> ``providers.aws``), but two modules of different top-level
packages are siblings of nothing: ``controller.config`` -> ``providers.real`` -> ``controller.config``
escapes it. This test builds the module graph with grimp (import-linter's own graph builder, which
counts imports made only for type checking and imports inside functions) and fails on any cycle.
"""

from __future__ import annotations

import grimp

PACKAGES = ("controller", "policies", "providers")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (each sorted), plus any
    module importing itself: every import cycle lies inside one of them. Tarjan's algorithm, with
    an explicit stack (no recursion limit on deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or graph.direct_import_exists(importer=node, imported=node):
                    found.append(sorted(component))
    return sorted(found)


def test_the_cycle_finder_finds_cycles() -> None:
    g = grimp.ImportGraph()
    for importer, imported in [("a.x", "b.y"), ("b.y", "a.z"), ("a.z", "a.x"), ("a.z", "c"),
                               ("c", "d"), ("d", "c"), ("e", "a.x")]:
        g.add_import(importer=importer, imported=imported)
    assert cycles(g) == [["a.x", "a.z", "b.y"], ["c", "d"]]


def test_no_module_imports_its_way_back_to_itself() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    found = cycles(graph)
    detail = []
    for component in found:
        chain = graph.find_shortest_chain(importer=component[0], imported=component[-1]) or ()
        back = graph.find_shortest_chain(importer=component[-1], imported=component[0]) or ()
        detail.append(" -> ".join(chain) + " | " + " -> ".join(back))
    assert found == [], "import cycles:\n" + "\n".join(detail)
