#!/usr/bin/env python3
"""The module arrows, checked against the build (ctest architecture.module_arrows).

Reads MODULE_DEPS (written by CMake at configure time: each module's folder and the proplab modules its target
links directly) and every `#include "..."` under src/, gui/ and kernels/ of SOURCE_DIR, and fails, naming file and
line, when
  - a file includes a header of a module its module's target does not declare (includes of optional modules this
    configuration does not build, such as kernels/ without CUDA, are conditional and not counted);
  - a module declares a module it includes nothing from (the declaration must say what the code uses);
  - the modules form a cycle;
  - an arrow breaks a rule of docs/architecture.md: theory uses only spec and core; the GUI (gui/*) and kernels
    reach neither train nor study. (That nothing below models reaches models is what having no cycle means.)

usage: check_modules.py MODULE_DEPS SOURCE_DIR
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
# module -> the only modules it may use (directly).
ONLY = {"theory": {"core", "spec"}, "spec": set(), "core": set()}
# modules -> modules they must not reach, directly or through others.
NEVER_REACH = [(("gui/data", "gui/plot", "gui/app", "gui/report", "kernels"), ("train", "study"))]


def read_declared(path):
    """module -> the modules its targets link directly (a folder with two targets gets the union), and the optional
    modules this configuration does not build."""
    declared, absent = {}, set()
    with open(path) as f:
        for line in f:
            if ":" not in line:
                continue
            module, deps = line.split(":", 1)
            if module.strip() == "absent":
                absent = set(deps.split())
            else:
                declared.setdefault(module.strip(), set()).update(deps.split())
    return declared, absent


def module_of_file(relative):
    """The module a source file belongs to: src/<m>/..., gui/<m>/..., kernels/..."""
    parts = relative.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "gui" and len(parts) > 2:
        return "gui/" + parts[1]
    if parts[0] == "kernels":
        return "kernels"
    return None


def module_of_include(include, modules):
    parts = include.split("/")
    if parts[0] == "src" and len(parts) > 2:  # ("src/<m>/..." reaches past the module's include root)
        return parts[1]
    if parts[0] == "gui" and len(parts) > 2:
        return "gui/" + parts[1]
    return parts[0] if parts[0] in modules else None


def reach(graph, start):
    seen, stack = set(), [start]
    while stack:
        for dep in graph.get(stack.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


def find_cycle(graph):
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    declared, absent = read_declared(sys.argv[1])
    root = sys.argv[2]
    modules = set(declared)
    known = modules | absent
    failures = []
    used = {m: set() for m in modules}
    for top in ("src", "gui", "kernels"):
        for directory, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root)
                module = module_of_file(relative)
                if module is None or module not in modules:
                    continue
                with open(path, errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        target = module_of_include(match.group(1), known)
                        # (an optional module this configuration does not build is included conditionally)
                        if target is None or target == module or target in absent:
                            continue
                        used[module].add(target)
                        if match.group(1).startswith("src/"):
                            failures.append('%s:%d: includes "%s"; allowed: modules by their own path ("%s")' %
                                            (relative, number, match.group(1), match.group(1)[4:]))
                        if target not in declared[module]:
                            failures.append('%s:%d: includes "%s", but module %s does not declare %s (its target '
                                            'links %s)' % (relative, number, match.group(1), module, target,
                                                           ", ".join(sorted(declared[module])) or "no module"))
    for module in sorted(modules):
        for dep in sorted(declared[module] - used[module]):
            failures.append("module %s declares %s but includes nothing from it" % (module, dep))
        if module in ONLY and not declared[module] <= ONLY[module]:
            failures.append("module %s uses %s; allowed: %s" % (module, ", ".join(sorted(declared[module])),
                                                               ", ".join(sorted(ONLY[module])) or "nothing"))
    cycle = find_cycle(declared)
    if cycle:
        failures.append("the modules form a cycle: " + " -> ".join(cycle))
    for sources, forbidden in NEVER_REACH:
        for module in sources:
            if module not in declared:
                continue
            bad = reach(declared, module) & set(forbidden)
            if bad:
                failures.append("module %s reaches %s (allowed: neither %s)" % (module, ", ".join(sorted(bad)),
                                                                                 " nor ".join(forbidden)))
    for failure in failures:
        print(failure)
    if failures:
        return 1
    arrows = sum(len(deps) for deps in declared.values())
    print("architecture: %d modules, %d arrows, every include declared, no cycle" % (len(modules), arrows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
