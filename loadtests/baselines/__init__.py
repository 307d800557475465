"""The designs users would otherwise pick, kept small, for the side-by-side benchmark only: each
serves ``POST /embed {"texts": [...]}`` from the same stored fp32 ONNX model as the stack."""
