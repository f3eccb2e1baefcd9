#!/usr/bin/env python3
"""Checks the repository's layout rules: no source file under engine/, kernels/, plugins/ or tools/
over 1,000 lines and no test file over 1,500; kernels/ holds device code only; each component
includes only what it may depend on (docs/architecture.md), the engine's folders in layers
(cli and api -> training -> core -> pipeline, the backends cpu and cuda beside core, reaching it only
through its backend interfaces); no two headers of the tree share a file name. Prints every breach
and exits 1 if there is one.
Usage: tools/check_layout.py [REPO_ROOT]   (default: the folder above tools/)
"""
import pathlib
import re
import sys

SOURCE = {".cpp", ".hpp", ".cu", ".cuh", ".h", ".py", ".sh"}
HEADER = {".hpp", ".h", ".cuh"}
LIMITS = [("engine", 1000), ("kernels", 1000), ("plugins", 1000), ("tools", 1000), ("tests", 1500)]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# What each folder of engine/src may include besides the SDK and itself.
ENGINE_LAYERS = {
    "pipeline": {"pipeline"},
    "core": {"pipeline", "core"},
    "training": {"pipeline", "core", "training"},
    "api": {"pipeline", "core", "training", "export", "api"},
    "export": {"pipeline", "core", "export"},
    "cli": {"pipeline", "core", "training", "export", "cli"},
    "cpu": {"pipeline", "cpu"},
    "cuda": {"pipeline", "cuda"},
}
# The core's headers a backend implements or fills (the runtime and the engine's own ops).
BACKEND_INTERFACES = {"core/runtime.hpp", "core/engine_ops.hpp"}
# The headers the engine shares with its kernels: plain descriptors and host-device math.
KERNEL_SHARED = {"core/engine_ops.hpp", "core/philox.h", "core/replay_tree.h"}


def sdk(inc):
    return inc.startswith("dqn/") or inc == "dqn_config.h"


def component_rules(root):
    """(folder, test on an include path) per component: what its quoted includes may name."""
    kernels = {p.name for p in (root / "kernels").glob("*.cuh")}
    rules = [
        ("kernels", lambda inc: sdk(inc) or inc in kernels or inc in KERNEL_SHARED),
        ("plugins", sdk),
    ]
    for group, may in ENGINE_LAYERS.items():
        def allowed(inc, group=group, may=may):
            if sdk(inc) or inc.split("/")[0] in may:
                return True
            if group in ("cpu", "cuda") and inc in BACKEND_INTERFACES | KERNEL_SHARED:
                return True
            return group == "cuda" and inc in kernels
        rules.append((f"engine/src/{group}", allowed))
    return rules


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
    groups = {p.name for p in (root / "engine" / "src").iterdir() if p.is_dir()}
    for g in sorted(groups - set(ENGINE_LAYERS)):
        breaches.append(f"engine/src/{g}/: not a layer the rules know ({', '.join(ENGINE_LAYERS)})")
    # the project's include folders: an include found in none of them is a library's (not checked)
    project_dirs = [root / d for d in ("engine/include", "engine/src", "kernels")]
    for folder, allowed in component_rules(root):
        for p in sorted((root / folder).rglob("*")):
            if not (p.is_file() and p.suffix in {".cpp", ".hpp", ".cu", ".cuh", ".h"}):
                continue
            for inc in INCLUDE.findall(p.read_text(encoding="utf-8", errors="replace")):
                local = (p.parent / inc).exists()  # a file beside it (its own folder)
                project = any((d / inc).exists() for d in project_dirs)
                if project and not local and not allowed(inc):
                    breaches.append(f"{p.relative_to(root)}: includes \"{inc}\", outside what {folder}/ may use")
    seen = {}
    for folder in ("engine", "kernels", "plugins", "tests", "tools", "examples"):
        for p in sorted((root / folder).rglob("*")):
            if p.is_file() and p.suffix in HEADER:
                if p.name in seen:
                    breaches.append(f"{p.relative_to(root)}: a header named as {seen[p.name]} (names are unique)")
                else:
                    seen[p.name] = p.relative_to(root)
    for b in breaches:
        print(b)
    print(f"layout: {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
