"""Model pipeline: builds every model the services need into the BentoML model store.

`python -m models.build` (``make models``) builds every model of the catalogue
(models/catalogue.yaml): its tokenizer, ONNX fp32 and int8, a framework-native TensorFlow
SavedModel, each behind its parity gate; and trains the tenants' SentencePiece model.
`python -m models.parity` (``make parity``) reports every model's backends against PyTorch.
"""
