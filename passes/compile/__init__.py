"""Passes that prepare a model for fast start-up on one onnxruntime target: the offline-optimized
model (``ort_serialize``) and the EP-compiled EPContext model (``ort_compile``)."""
