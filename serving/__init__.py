"""The serving core that the public service (``services/``) and the runners (``runners/``) share.

They import this package and never each other (``make lint`` holds it); every bento carries it.

- ``protocol``: the types on the wire between the tokenizer and the runners;
- ``errors``: errors that answer with their own status (404, 422, 429/503 + Retry-After);
- ``batching``: admission, the token-budget queue, length-aware grouping, the runner's batcher, metrics;
- ``contracts`` and ``engines``: model names and tensor contracts, checked when ONNX Runtime or
  TensorFlow loads a model (the engines live here, not in a runner, so that the build pipeline's
  parity check runs the very engines that serve without importing a runner; the runtimes
  themselves are imported only when an engine is built, so the tokenizer's image has neither);
- ``features``: tokenizer loading, dynamic padding, cosine; ``tenant_names``: the tenant name rule;
- ``settings``: available cores and the queue limits every service's settings inherit.
"""
