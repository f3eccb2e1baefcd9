"""A small reader of TensorBoard event files for the tests: the TFRecord framing with both masked
CRC-32C checked, and the Event / Summary.Value fields the engine writes, decoded from the protobuf
wire format (tensorflow/core/util/event.proto, summary.proto)."""
import glob
import json
import math
import os
import struct


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc_table()


def masked_crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(b, i):
    v = shift = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return v, i


def _fields(b):
    """(field number, wire type, value) of a message's bytes."""
    i = 0
    while i < len(b):
        k, i = _varint(b, i)
        field, wire = k >> 3, k & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, v


def records(path):
    """Every record's data; ValueError on a bad length or data CRC."""
    with open(path, "rb") as f:
        data = f.read()
    i, out = 0, []
    while i < len(data):
        header = data[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hc != masked_crc32c(header):
            raise ValueError(f"{path}: record at byte {i}: length CRC")
        body = data[i + 12:i + 12 + n]
        (dc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        if len(body) != n or dc != masked_crc32c(body):
            raise ValueError(f"{path}: record at byte {i}: data CRC")
        out.append(body)
        i += 16 + n
    return out


def events(path):
    """[(wall_time, step, file_version or None, {tag: value})] of an event file."""
    out = []
    for r in records(path):
        wall, step, version, values = None, 0, None, {}
        for f, _, v in _fields(r):
            if f == 1:
                (wall,) = struct.unpack("<d", v)
            elif f == 2:
                step = v
            elif f == 3:
                version = v.decode()
            elif f == 5:
                for sf, _, sv in _fields(v):
                    if sf != 1:
                        continue
                    tag, val = None, None
                    for vf, _, vv in _fields(sv):
                        if vf == 1:
                            tag = vv.decode()
                        elif vf == 2:
                            (val,) = struct.unpack("<f", vv)
                    values[tag] = val
        out.append((wall, step, version, values))
    return out


def run_events(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if len(files) != 1:
        raise ValueError(f"{run_dir}: {len(files)} event files, expected one")
    return events(files[0])


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def compare_with_metrics(run_dir):
    """Problems (empty: none) between a run's event file and its metrics.jsonl: a version record
    first, then one record per line at the line's step holding every number of the line but step
    and eval_seed ("loss.c51" as "loss/c51"), as float32."""
    ev = run_events(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    problems = []
    if not ev or ev[0][2] != "brain.Event:2":
        problems.append("the first record is not file_version brain.Event:2")
    ev = ev[1:]
    if len(ev) != len(lines):
        problems.append(f"{len(ev)} scalar records for {len(lines)} metrics lines")
    for k, (line, (_, step, _, values)) in enumerate(zip(lines, ev)):
        if step != line["step"]:
            problems.append(f"record {k}: step {step}, the line's is {line['step']}")
        want = {key.replace(".", "/", 1): f32(x) for key, x in line.items()
                if isinstance(x, (int, float)) and not isinstance(x, bool) and key not in ("step", "eval_seed")}
        if set(want) != set(values):
            problems.append(f"record {k}: tags {sorted(set(values) ^ set(want))} differ")
        for tag, x in want.items():
            got = values.get(tag)
            if got is None or not (got == x or (math.isnan(got) and math.isnan(x))):
                problems.append(f"record {k} (step {step}): {tag} = {got}, the line's {x}")
    return problems
