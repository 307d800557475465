"""Model-runner services: each takes token-id sequences (never text) and batches them itself.

Every runner batches with the shared core (``serving.batching``) and loads its models with the
shared engines (``serving.engines``); ``runners.onnx`` and ``runners.tf`` serve the catalogue's models, and
``runners.tenants`` the per-customer classifiers. The modules here are what the runners share
among themselves: settings, the embedding API body, TF Serving's REST API.
"""
