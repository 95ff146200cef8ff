"""Reading and writing safetensors files with numpy alone (the fixture and conversion scripts
write bf16 and FP8, which numpy has no types for)."""

import json
import struct

import numpy as np


def bf16_bytes(values):
    """float32 -> bf16 (round to nearest even), little-endian bytes."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


def read_bf16(path):
    """``{name: float32 array}`` of a file whose tensors are all bf16."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", name
        start, end = info["data_offsets"]
        raw = np.frombuffer(data[start:end], dtype="<u2")
        tensors[name] = (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
    return tensors


def write(path, tensors):
    """Writes ``{name: (dtype, shape, bytes)}`` (dtype as safetensors names it: BF16, F32,
    F8_E4M3, ...), names in order."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for blob in blobs:
            out.write(blob)
