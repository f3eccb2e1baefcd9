#!/usr/bin/env python3
"""Summarise an ncu --csv per-kernel file (tools/lab/gpu_profile.sh): the kernels of the last
replayed step, in order, with their device time, any other metrics collected (NCU_METRICS) after
it, and the total (of each summable metric too: bytes)."""
import csv, io, sys

def rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no ncu CSV table found")
    return list(csv.DictReader(io.StringIO(text[start:])))

def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None

def main():
    for path in sys.argv[1:]:
        every = rows(path)
        others = {}  # kernel ID -> [(metric, value)] besides the duration
        for x in every:
            if x.get("Metric Name") != "gpu__time_duration.sum":
                others.setdefault(x["ID"], []).append((x["Metric Name"], x["Metric Value"]))
        r = [x for x in every if x.get("Metric Name") == "gpu__time_duration.sum"]
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
        sums = {}
        print(f"== {path}: {len(last)} kernels per step")
        for x in last:
            ns = float(x["Metric Value"].replace(",", ""))
            total += ns
            extra = ""
            for name, value in others.get(x["ID"], []):
                extra += f"  {name}={value}"
                v = number(value)
                if v is not None and "bytes" in name:
                    sums[name] = sums.get(name, 0.0) + v
            print(f"{ns / 1000:8.2f} us  {x['Kernel Name'][:110]}{extra}")
        print(f"{total / 1000:8.2f} us  total kernel time per step")
        for name, v in sums.items():
            print(f"{v:14.0f}  {name}, summed over the step's kernels")

main()
