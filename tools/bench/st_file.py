"""The project's own safetensors reader and writer (json + struct, nothing else), for Pythons
without the `safetensors` package (Debian 12 has none): tools/st_check.py reads with it and
tools/bench/torch_peer.py reads and writes with it when `import safetensors` fails.

A tensor is (dtype, shape, raw little-endian bytes); the caller decodes the bytes.
"""
import json
import math
import struct
from collections import Counter

MAX_HEADER_BYTES = 100_000_000
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


class BadFile(Exception):
    pass


def read(path):
    """Returns ({name: (dtype, shape, raw bytes)}, metadata), validating like the reference reader."""
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
    tensors = {name: (header[name]["dtype"], list(header[name]["shape"]), data[begin:end])
               for begin, end, name in spans}
    return tensors, metadata


def write(path, tensors, metadata=None):
    """Writes {name: (dtype, shape, raw bytes)} in name order, the header padded to 8 bytes."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        if len(raw) != math.prod(shape) * SIZES[dtype]:
            raise ValueError("tensor %r: %d bytes for shape %r of %s" % (name, len(raw), shape, dtype))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in chunks:
            f.write(raw)
