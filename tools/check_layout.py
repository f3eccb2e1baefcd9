#!/usr/bin/env python3
"""Checks the repository's layout rules: no source file under engine/, cuda_backend/, kernels/,
plugins/ or tools/ over 1,000 lines and no test file over 1,500; kernels/ holds device code only;
each component includes only what it may depend on (docs/architecture.md). Prints every breach
and exits 1 if there is one.
Usage: tools/check_layout.py [REPO_ROOT]   (default: the folder above tools/)
"""
import pathlib
import re
import sys

SOURCE = {".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh"}
LIMITS = [("engine", 1000), ("cuda_backend", 1000), ("kernels", 1000), ("plugins", 1000), ("tools", 1000),
          ("tests", 1500)]
# Where a component's quoted includes may point: the SDK ("dqn/..."), the config header, and
# the folders listed (relative to the including file's component).
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def component_rules(root):
    """(folder, test on an include path) per component: what its quoted includes may name."""
    def sdk(inc):
        return inc.startswith("dqn/") or inc == "dqn_config.h"

    kernels = {p.name for p in (root / "kernels").glob("*.cuh")}
    cuda_backend = {p.name for p in (root / "cuda_backend").glob("*.hpp")}
    return [
        ("kernels", lambda inc: sdk(inc) or inc in kernels),
        ("cuda_backend", lambda inc: sdk(inc) or inc in kernels or inc in cuda_backend),
        ("plugins", lambda inc: sdk(inc)),
        # the engine's own folders (engine/src/<group>/...), never kernels/ or cuda_backend/
        ("engine", lambda inc: sdk(inc) or re.match(r"^(cli|core|cpu|pipeline|training)/", inc) is not None
         or "/" not in inc),
    ]


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    breaches = []
    for folder, limit in LIMITS:
        for p in sorted((root / folder).rglob("*")):
            if p.is_file() and p.suffix in SOURCE:
                n = sum(1 for _ in p.open(encoding="utf-8", errors="replace"))
                if n > limit:
                    breaches.append(f"{p.relative_to(root)}: {n} lines, more than {limit}")
    for p in sorted((root / "kernels").iterdir()):
        if p.is_file() and p.suffix not in {".cu", ".cuh"} and p.name != "meson.build":
            breaches.append(f"{p.relative_to(root)}: kernels/ holds device code only (.cu, .cuh)")
    # the project's include folders: an include found in none of them is a library's (not checked)
    project_dirs = [root / d for d in ("engine/include", "engine/src", "kernels", "cuda_backend")]
    for folder, allowed in component_rules(root):
        for p in sorted((root / folder).rglob("*")):
            if not (p.is_file() and p.suffix in {".cpp", ".hpp", ".cu", ".cuh", ".h"}):
                continue
            for inc in INCLUDE.findall(p.read_text(encoding="utf-8", errors="replace")):
                local = (p.parent / inc).exists()  # a file beside it (its own folder)
                project = any((d / inc).exists() for d in project_dirs)
                if project and not local and not allowed(inc):
                    breaches.append(f"{p.relative_to(root)}: includes \"{inc}\", outside what {folder}/ may use")
    for b in breaches:
        print(b)
    print(f"layout: {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
