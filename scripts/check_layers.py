#!/usr/bin/env python3
"""Checks the layer rules of docs/architecture.md against the sources:
  1. every src/<layer>/ file includes only its own layer and the layers its table row allows;
  2. each foundry_layer(<layer> DEPS ...) in CMakeLists.txt (and the foundry executable for
     cli/) lists exactly the layers and libraries the layer's non-test sources use: by
     #include, or, for OpenMP, by #pragma omp.
Prints each mismatch and exits 1 if there is any.  Usage: scripts/check_layers.py [root]"""
import os
import re
import sys

LIBRARIES = [('fmt/', 'fmt::fmt'), ('nlohmann/', 'nlohmann_json::nlohmann_json'),
             ('omp.h', 'OpenMP::OpenMP_CXX'), ('xxhash.h', 'PkgConfig::XXHASH'),
             ('oneapi/dnnl', 'DNNL::dnnl'), ('mpi.h', 'MPI::MPI_C'),
             ('sentencepiece', 'PkgConfig::SENTENCEPIECE'), ('CLI/', 'CLI11::CLI11')]
TEST_FILE = re.compile(r'(_test|_mpitest|_perf)\.cpp$|^test_|^mpi_test_main')
INCLUDE = re.compile(r'\s*#\s*include\s*([<"])([^>"]+)[>"]')


def allowed_layers(root):
    """Layer -> the layers it may include, from the table of docs/architecture.md."""
    order, rows = [], []
    for line in open(os.path.join(root, 'docs', 'architecture.md')):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        layers = re.findall(r'`(\w+)/`', cells[0]) if len(cells) == 3 else []
        if layers:
            rows.append((layers, cells[2]))
            order += layers
    allowed = {}
    for layers, may in rows:
        above = order[:order.index(layers[0])]
        names = above if may.startswith('everything') else re.findall(r'\b(\w+)\b', may)
        for layer in layers:
            allowed[layer] = {n for n in names if n in order}
    return allowed


def uses(root, layer):
    """(file, included layer) pairs of every file, and what the non-test sources use."""
    includes, deps = [], set()
    folder = os.path.join(root, 'src', layer)
    for name in sorted(os.listdir(folder)):
        for line in open(os.path.join(folder, name), errors='replace'):
            if re.match(r'\s*#\s*pragma\s+omp', line) and not TEST_FILE.search(name):
                deps.add('OpenMP::OpenMP_CXX')
            m = INCLUDE.match(line)
            if not m:
                continue
            path = m.group(2)
            first = path.split('/')[0]
            if m.group(1) == '"' and os.path.isdir(os.path.join(root, 'src', first)):
                includes.append((name, first))
                if first != layer and not TEST_FILE.search(name):
                    deps.add('foundry_' + first)
            elif not TEST_FILE.search(name):
                deps.update(lib for prefix, lib in LIBRARIES if path.startswith(prefix))
    return includes, deps


def declared_deps(root):
    cmake = open(os.path.join(root, 'CMakeLists.txt')).read()
    deps = {m.group(1): set(m.group(2).split())
            for m in re.finditer(r'foundry_layer\((\w+)\s+DEPS\s+([^)]*)\)', cmake)}
    m = re.search(r'target_link_libraries\(foundry\s+PRIVATE\s+([^)]*)\)', cmake)
    deps['cli'] = set(m.group(1).split()) if m else set()
    return deps


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    allowed, declared = allowed_layers(root), declared_deps(root)
    problems = []
    for layer in sorted(os.listdir(os.path.join(root, 'src'))):
        includes, deps = uses(root, layer)
        for name, other in includes:
            if other != layer and other not in allowed.get(layer, set()):
                problems.append(f'src/{layer}/{name} includes {other}/, not allowed for {layer}/')
        have = declared.get(layer, set())
        for dep in sorted(deps - have):
            problems.append(f'{layer}: uses {dep}, missing from its DEPS')
        for dep in sorted(have - deps):
            problems.append(f'{layer}: DEPS lists {dep}, which its sources do not use')
    print('\n'.join(problems) if problems else 'layers: includes and DEPS agree')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
