"""Weights that a variant graph shares with a contract graph are stored once.

A decoder variant (twostep.artifact.spec) holds the plain decoder's weights but for the few tensors it packs
differently. After both are written, every initializer of the variant whose bytes equal one of the contract
graph's (its own type and shape stay in the variant) becomes ONNX external data that points into the contract
graph's own file: location `decoder.onnx`, at the offset where those bytes lie. The contract graphs are not
touched (byte for byte what TensorRT, ort-cuda and the C++ library read), and the artifact grows only by what
differs.

A model past EXTERNAL_DATA_BYTES of parameters (protobuf serializes no message over 2 GB, and a graph with a
transposed copy of a 256k-row table grows past that) is written otherwise: every graph keeps its weights as
external data in one file, WEIGHTS, each distinct tensor once (a table tied between encoder and decoder, the
variants' weights), and the graph files hold only the structure (store_once). Until then, the steps that
rewrite a graph (quantization, fp16) save a large graph with its own external data (save_graph).

The trust rules hold as for any external data: the location is a listed, hashed file of the artifact
(twostep.artifact.trust).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx

from twostep.artifact.trust import external_data_locations

SMALLEST = 1024  # bytes: smaller tensors stay where they are (a reference costs about as much as the data)

EXTERNAL_DATA_BYTES = 1 << 30  # parameter bytes past which an artifact keeps its weights in WEIGHTS
WEIGHTS = "weights.data"
PAGE = 4096  # each tensor's offset in a data file: ONNX Runtime maps page-aligned external data
CHUNK = 64 << 20  # bytes copied at once
IN_FLIGHT = 256 << 20  # bytes of tensors a writer holds at once (one tensor at a time past that)

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
        point_to(tensor, source.name, *span)
        shared += 1
    onnx.save(model, str(variant))
    return shared


def tensor_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the initializers held in the model (loaded external data included)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Save `model` (its external data loaded) at `path`, replacing what was there: inline, or past
    EXTERNAL_DATA_BYTES with its tensors in `<name>.data` beside it. The files the former graph kept its external
    data in are removed (each belongs to this graph alone until store_once)."""
    stale = external_data_locations(path) if path.is_file() else set()
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx.save appends to an existing file
    if tensor_bytes(model) > EXTERNAL_DATA_BYTES:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
                  size_threshold=SMALLEST)
        stale.discard(data.name)
    else:
        onnx.save(model, str(path))
    for name in stale:
        (path.parent / name).unlink(missing_ok=True)


def parameter_bytes(module) -> int:
    """The bytes of a module's parameters: past EXTERNAL_DATA_BYTES its graphs keep their weights outside."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def point_to(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make `tensor` external data at `offset`, `length` bytes, of the file `location` (its bytes, if it held
    them, dropped)."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def external_span(tensor: onnx.TensorProto) -> tuple[str, int, int] | None:
    """(location, offset, length) of an initializer kept as external data, else None."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {entry.key: entry.value for entry in tensor.external_data}
    return info["location"], int(info.get("offset", 0)), int(info["length"])


def copy_span(source, offset: int, length: int, out, digest) -> None:
    """Copy `length` bytes at `offset` of the open file `source` to `out`, hashing them into `digest`, CHUNK
    bytes at a time: read, not mapped, so that the copy holds one chunk of memory."""
    source.seek(offset)
    while length:
        chunk = source.read(min(CHUNK, length))
        if not chunk:
            raise OSError(f"{source.name}: external data ends {length} bytes early")
        digest.update(chunk)
        out.write(chunk)
        length -= len(chunk)


def store_once(graphs: list[Path]) -> int:
    """Move every initializer of `graphs` (files of one directory, their external data beside them) of
    SMALLEST bytes or more into the directory's WEIGHTS file, each distinct content once, at page-aligned
    offsets, and remove the data files they used before, each as soon as no graph still to be stored reads it (the
    disk holds the graphs' files and WEIGHTS together only as long as it must). Streams: a graph's structure is
    loaded without its data, and each tensor is copied chunk by chunk (a tensor whose bytes are already in
    WEIGHTS is written, found to be a copy, and cut off again). Returns the bytes of WEIGHTS."""
    directory = graphs[0].parent
    weights = directory / WEIGHTS
    stale: set[str] = set()
    offsets: dict[bytes, tuple[int, int]] = {}
    models = [onnx.load(str(path), load_external_data=False) for path in graphs]  # structures: a few MB
    reads = [{span[0] for t in model.graph.initializer if (span := external_span(t))} for model in models]
    with open(weights, "w+b") as out:
        for i, (path, model) in enumerate(zip(graphs, models)):
            sources = {}
            try:
                for tensor in model.graph.initializer:
                    span = external_span(tensor)
                    if span is None and len(tensor.raw_data) < SMALLEST:
                        continue
                    start = out.seek(0, 2)
                    start += out.write(bytes(-start % PAGE))
                    digest = hashlib.sha256()
                    if span is None:
                        digest.update(tensor.raw_data)
                        out.write(tensor.raw_data)
                        length = len(tensor.raw_data)
                    else:
                        location, offset, length = span
                        stale.add(location)
                        if location not in sources:
                            sources[location] = open(directory / location, "rb")  # noqa: SIM115 (closed below)
                        copy_span(sources[location], offset, length, out, digest)
                    key = digest.digest()
                    if key in offsets:
                        out.truncate(start)
                    else:
                        offsets[key] = (start, length)
                    point_to(tensor, WEIGHTS, *offsets[key])
            finally:
                for source in sources.values():
                    source.close()
            onnx.save(model, str(path))
            for name in stale - {WEIGHTS} - set().union(*reads[i + 1 :]):
                (directory / name).unlink(missing_ok=True)
                stale.discard(name)
        size = out.seek(0, 2)
    return size
