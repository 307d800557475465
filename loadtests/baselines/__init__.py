"""The designs users would otherwise pick, kept small, for the side-by-side benchmark only.

Both serve ``POST /embed {"texts": [...]} -> {"embeddings": [...]}`` from the same stored fp32 ONNX
model and tokenizer as the stack, so the same Locust client drives every system.
"""
