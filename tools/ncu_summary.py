#!/usr/bin/env python3
"""Summarise an ncu --csv per-kernel file (tools/gpu_profile.sh): the kernels of the last
replayed step, in order, with their device time, and the total."""
import csv, io, sys

def rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV table found")
    return list(csv.DictReader(io.StringIO(text[start:])))

def main():
    for path in sys.argv[1:]:
        r = [x for x in rows(path) if x.get("Metric Name") == "gpu__time_duration.sum"]
        n = int(sys.argv[0:1] and 0) or None
        # the graph's kernels repeat once per replay: find the period from the tail
        names = [x["Kernel Name"] for x in r]
        per = None
        for p in range(1, len(names) // 2 + 1):
            if names[-p:] == names[-2 * p:-p]:
                per = p
                break
        last = r[-per:] if per else r
        total = 0.0
        print(f"== {path}: {len(last)} kernels per step")
        for x in last:
            ns = float(x["Metric Value"].replace(",", ""))
            total += ns
            print(f"{ns / 1000:8.2f} us  {x['Kernel Name'][:110]}")
        print(f"{total / 1000:8.2f} us  total kernel time per step")

main()
