"""Generation engines behind the engine-receiver hooks (``rlinfra.services.weights.engine``):
``rlinfra.engines.vllm`` hosts vLLM in a worker's own process. Each engine module imports its
engine only when an engine is started, so importing rlinfra never needs one installed."""
