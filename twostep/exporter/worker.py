"""A graph-building worker process of `twostep export` (export.build_graphs starts it):

    python -m twostep.exporter.worker < call.json

The call, one JSON object on stdin: {"checkpoint", "graphs": {graph: path}, "opset", "optimize", "precision",
"parent", "external_data_bytes"}. The worker loads the checkpoint, writes the graphs one after another
(export.build_graph) and prints one JSON line: {"built": {graph: {"fusions", "quantization"}}}, or, for an
error the user can fix, {"error": its class in twostep.errors, "message"} with exit status 1. Anything else is
a bug: its traceback goes to stderr, exit status 1.

A worker never outlives the export that started it (a killed `twostep export` must not leave a process writing
into a directory the next run cleans up): a watchdog thread ends it within 0.2 s of its parent's death. (Not
PR_SET_PDEATHSIG through Popen's preexec_fn, which is unsafe in a parent with threads, as the CLI's spinner.)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from twostep.errors import TwostepError


def watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def main() -> int:
    call = json.loads(sys.stdin.read())
    threading.Thread(target=watch, args=(call["parent"],), daemon=True).start()
    from twostep.exporter import shared
    from twostep.exporter.export import build_graph
    from twostep.model.checkpoint import load_checkpoint

    shared.EXTERNAL_DATA_BYTES = call["external_data_bytes"]  # the parent's: the graphs are written as it stores them
    built = {}
    try:
        model = load_checkpoint(Path(call["checkpoint"])).model.eval()
        for graph, path in call["graphs"].items():
            fusions, quantization = build_graph(model, graph, Path(path), call["opset"], call["optimize"],
                                                call["precision"])
            built[graph] = {"fusions": fusions, "quantization": quantization}
    except TwostepError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 1
    print(json.dumps({"built": built}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
