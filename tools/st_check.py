#!/usr/bin/env python3
"""Inspect a safetensors file written by dqn-engine: list its tensors and check expected names.

Uses the `safetensors` package when it is installed (the reference reader); otherwise the
project's own parser (tools/bench/st_file.py: json + struct; numpy, when present, decodes the values)
that applies the same checks.
Exit status: 0 if the file is valid and every --expect name is present, 1 otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))
import st_file  # noqa: E402  the built-in parser, shared with tools/bench/torch_peer.py

try:
    import numpy as np
except ImportError:  # the fallback still works, with summaries computed in Python
    np = None

STRUCT_CODES = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h",
                "I8": "b", "U64": "Q", "U32": "I", "U16": "H", "U8": "B", "BOOL": "?"}
FLOATS = ("F64", "F32", "F16", "BF16")


def decode_values(dtype, raw):
    """Raw little-endian bytes -> numpy array (if numpy) or a list of Python numbers."""
    if np is not None:
        if dtype == "BF16":
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        npd = {"BOOL": np.bool_}.get(dtype, None)
        if npd is None:
            npd = np.dtype("<" + STRUCT_CODES[dtype])
        return np.frombuffer(raw, dtype=npd)
    n = len(raw) // st_file.SIZES[dtype]
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    return list(struct.unpack("<%d%s" % (n, STRUCT_CODES[dtype]), raw))


def parse_fallback(path):
    """Returns ({name: (dtype, shape, values)}, metadata), validating like the reference reader."""
    entries, metadata = st_file.read(path)
    return {name: (dtype, shape, decode_values(dtype, raw))
            for name, (dtype, shape, raw) in entries.items()}, metadata


def load_with_package(path):
    """The reference reader. safetensors.numpy has no bfloat16, so files holding BF16 are read
    through safetensors' raw deserialize() instead (still the package's own validation)."""
    import safetensors
    from safetensors.numpy import load_file
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
    metadata = header.pop("__metadata__", None) or {}
    if any(isinstance(e, dict) and e.get("dtype") == "BF16" for e in header.values()):
        with open(path, "rb") as f:
            raw = safetensors.deserialize(f.read())
        tensors = {}
        for name, v in raw:
            dt = header[name]["dtype"]
            tensors[name] = (dt, list(v["shape"]), decode_values(dt, bytes(v["data"])))
        return tensors, metadata, "safetensors %s (deserialize; BF16 present)" % safetensors.__version__
    arrays = load_file(path)
    tensors = {name: (header[name]["dtype"], list(a.shape), a.reshape(-1)) for name, a in arrays.items()}
    return tensors, metadata, "safetensors %s (safetensors.numpy.load_file)" % safetensors.__version__


def summary(dtype, values):
    count = len(values)
    if count == 0:
        return "empty"
    if dtype in FLOATS:
        if np is not None:
            v = np.asarray(values, dtype=np.float64)
            finite = v[np.isfinite(v)]
            bad = count - finite.size
            if finite.size == 0:
                return "no finite values (%d nan/inf)" % bad
            s = "min %.6g max %.6g mean %.6g" % (finite.min(), finite.max(), finite.mean())
        else:
            finite = [x for x in values if math.isfinite(x)]
            bad = count - len(finite)
            if not finite:
                return "no finite values (%d nan/inf)" % bad
            s = "min %.6g max %.6g mean %.6g" % (min(finite), max(finite), sum(finite) / len(finite))
        return s + (" (%d nan/inf)" % bad if bad else "")
    ints = [int(x) for x in values]
    if count <= 4:
        return "values %s" % ints
    return "min %d max %d" % (min(ints), max(ints))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--expect", default="", help="comma-separated tensor names that must be present")
    ap.add_argument("--prefix-count", action="store_true",
                    help="also print how many tensors share each name prefix")
    ap.add_argument("--prefix-depth", type=int, default=1,
                    help="dotted components that make a prefix for --prefix-count (default 1)")
    args = ap.parse_args(argv)

    if not os.path.isfile(args.file):
        print("st_check: %s: no such file" % args.file, file=sys.stderr)
        return 1
    try:
        import safetensors.numpy  # noqa: F401
        have_package = True
    except ImportError:
        have_package = False
    try:
        if have_package:
            tensors, metadata, loader = load_with_package(args.file)
        else:
            tensors, metadata = parse_fallback(args.file)
            loader = "built-in parser (json+struct%s; the safetensors package is not installed)" % (
                ", numpy %s" % np.__version__ if np is not None else ", no numpy")
    except Exception as e:  # the reference reader raises its own exception types
        print("st_check: %s: invalid safetensors file: %s" % (args.file, e), file=sys.stderr)
        return 1

    print("file: %s" % args.file)
    print("loader: %s" % loader)
    for k in sorted(metadata):
        print("metadata: %s = %s" % (k, metadata[k]))
    width = max([len(n) for n in tensors] + [4])
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        print("%-*s  %-4s  %-16s  %s" % (width, name, dtype, "[" + ",".join(map(str, shape)) + "]",
                                         summary(dtype, values)))
    print("%d tensors" % len(tensors))
    if args.prefix_count:
        counts = Counter(".".join(n.split(".")[:args.prefix_depth]) for n in tensors)
        for prefix in sorted(counts):
            print("prefix %s: %d" % (prefix, counts[prefix]))

    expected = [n for n in args.expect.split(",") if n]
    missing = [n for n in expected if n not in tensors]
    if missing:
        print("st_check: %s: missing %d of %d expected tensors: %s"
              % (args.file, len(missing), len(expected), ", ".join(missing)), file=sys.stderr)
        return 1
    if expected:
        print("all %d expected tensors present" % len(expected))
    return 0


if __name__ == "__main__":
    sys.exit(main())
