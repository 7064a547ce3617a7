"""Weights that a variant graph shares with a contract graph are stored once.

A decoder variant (twostep.artifact.spec) holds the plain decoder's weights but for the few tensors it packs
differently. After both are written, every initializer of the variant whose bytes equal one of the contract
graph's (its own type and shape stay in the variant) becomes ONNX external data that points into the contract
graph's own file: location `decoder.onnx`, at the offset where those bytes lie. The contract graphs are not
touched (byte for byte what TensorRT, ort-cuda and the C++ library read), and the artifact grows only by what
differs.

The trust rules hold as for any external data: the location is a listed, hashed file of the artifact
(twostep.artifact.trust).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

SMALLEST = 1024  # bytes: smaller tensors stay where they are (a reference costs about as much as the data)

# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9


def varint(data: memoryview, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def fields(data: memoryview, start: int, end: int):
    """(field number, start, end) of each length-delimited field of the protobuf message data[start:end]."""
    i = start
    while i < end:
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(data, i)
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        elif wire == 2:
            size, i = varint(data, i)
            yield number, i, i + size
            i += size
        else:
            raise ValueError(f"protobuf wire type {wire} (groups) is not used by ONNX")


def raw_data_spans(data: memoryview) -> dict[bytes, tuple[int, int]]:
    """Where the raw bytes of each initializer of a serialized ModelProto lie: sha256 of the content -> (offset,
    length). Keyed by digest, so that the file's tensors are not copied."""
    spans = {}
    for number, start, end in fields(data, 0, len(data)):
        if number != MODEL_GRAPH:
            continue
        for number, t_start, t_end in fields(data, start, end):
            if number != GRAPH_INITIALIZER:
                continue
            for number, r_start, r_end in fields(data, t_start, t_end):
                if number == TENSOR_RAW_DATA and r_end - r_start >= SMALLEST:
                    spans.setdefault(hashlib.sha256(data[r_start:r_end]).digest(), (r_start, r_end - r_start))
    return spans


def share_weights(variant: Path, source: Path) -> int:
    """Rewrite `variant` so that the initializers whose bytes lie in `source` (a graph file beside it) are read
    from there; returns how many. Tensors match by content: any place holding the same bytes is that tensor."""
    spans = raw_data_spans(memoryview(source.read_bytes()))
    model = onnx.load(str(variant))
    shared = 0
    for tensor in model.graph.initializer:
        raw = tensor.raw_data
        span = spans.get(hashlib.sha256(raw).digest()) if len(raw) >= SMALLEST else None
        if span is None:
            continue
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in zip(("location", "offset", "length"), (source.name, *map(str, span))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        shared += 1
    onnx.save(model, str(variant))
    return shared
