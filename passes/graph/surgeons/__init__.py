"""Named rewrites of an ONNX graph (Olive's graph surgeons), applied in order by ``graph_surgery``.

``specs`` holds each surgeon's typed options and loads nothing heavy (the engine imports it to
validate workflows); the other modules hold the rewrites, written with onnx_ir and onnxscript's
rewriter, and are imported when the pass runs.
"""
