"""Model pipeline: builds every model the services need into the BentoML model store.

`python -m models.build` (``make models``) exports the real MiniLM weights to ONNX (fp32, optimised,
int8), to a framework-native TensorFlow SavedModel, saves the fixed fast tokenizer and trains a
SentencePiece model; `python -m models.parity` (``make parity``) proves the backends agree.
"""
