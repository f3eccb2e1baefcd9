#!/usr/bin/env python3
"""Inspect a safetensors file written by dqn-engine: list its tensors and check expected names.

Uses the `safetensors` package when it is installed (the reference reader); otherwise a small
built-in parser (json + struct, with numpy when present) that applies the same checks.
Exit status: 0 if the file is valid and every --expect name is present, 1 otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys
from collections import Counter

try:
    import numpy as np
except ImportError:  # the fallback still works, with summaries computed in Python
    np = None

MAX_HEADER_BYTES = 100_000_000
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
STRUCT_CODES = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h",
                "I8": "b", "U64": "Q", "U32": "I", "U16": "H", "U8": "B", "BOOL": "?"}
FLOATS = ("F64", "F32", "F16", "BF16")


class BadFile(Exception):
    pass


def decode_values(dtype, raw):
    """Raw little-endian bytes -> numpy array (if numpy) or a list of Python numbers."""
    if np is not None:
        if dtype == "BF16":
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        npd = {"BOOL": np.bool_}.get(dtype, None)
        if npd is None:
            npd = np.dtype("<" + STRUCT_CODES[dtype])
        return np.frombuffer(raw, dtype=npd)
    n = len(raw) // SIZES[dtype]
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    return list(struct.unpack("<%d%s" % (n, STRUCT_CODES[dtype]), raw))


def parse_fallback(path):
    """Returns ({name: (dtype, shape, values)}, metadata), validating like the reference reader."""
    with open(path, "rb") as f:
        image = f.read()
    if len(image) < 8:
        raise BadFile("file is %d bytes, shorter than the 8-byte header length" % len(image))
    (n,) = struct.unpack("<Q", image[:8])
    if n > MAX_HEADER_BYTES:
        raise BadFile("header length %d is absurd (limit %d bytes)" % (n, MAX_HEADER_BYTES))
    if n > len(image) - 8:
        raise BadFile("header length %d is larger than the file (%d bytes after the length)"
                      % (n, len(image) - 8))
    text = image[8:8 + n]
    if not text.startswith(b"{"):
        raise BadFile("header is not a JSON object")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        dup = [k for k, c in Counter(keys).items() if c > 1]
        if dup:
            raise BadFile("header repeats the key %r" % dup[0])
        return dict(pairs)

    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadFile("header is not valid JSON: %s" % e)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadFile("__metadata__ must be an object of strings")
    data = image[8 + n:]
    spans = []
    for name, e in header.items():
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            raise BadFile("tensor %r: entry needs dtype, shape, data_offsets" % name)
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in SIZES:
            raise BadFile("tensor %r: unknown dtype %r" % (name, dtype))
        ints = lambda xs: isinstance(xs, list) and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)
        if not ints(shape):
            raise BadFile("tensor %r: bad shape %r" % (name, shape))
        if not ints(offs) or len(offs) != 2 or offs[1] < offs[0]:
            raise BadFile("tensor %r: bad data_offsets %r" % (name, offs))
        need = math.prod(shape) * SIZES[dtype]
        if offs[1] - offs[0] != need:
            raise BadFile("tensor %r: data_offsets %r span %d bytes, shape %r of %s needs %d"
                          % (name, offs, offs[1] - offs[0], shape, dtype, need))
        spans.append((offs[0], offs[1], name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if end > len(data):
            raise BadFile("truncated: tensor %r needs bytes [%d,%d) but the data section has %d"
                          % (name, begin, end, len(data)))
        if begin != covered:
            raise BadFile("tensor %r starts at %d, expected %d (overlap or gap)"
                          % (name, begin, covered))
        covered = end
    if covered != len(data):
        raise BadFile("data section has %d bytes, tensors cover %d" % (len(data), covered))
    tensors = {}
    for begin, end, name in spans:
        e = header[name]
        tensors[name] = (e["dtype"], list(e["shape"]), decode_values(e["dtype"], data[begin:end]))
    return tensors, metadata


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
