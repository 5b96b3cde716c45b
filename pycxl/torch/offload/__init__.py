"""Models fed from a tier: ``offload_layers`` (``layers``: layers streamed through a
ring of GPU buffers) and ``offload_model`` (``model``: a whole model trained with its
optimizer state, and optionally its weights, on a tier; ``layout``: blocks in flat
memory; ``block_weights``: weights streamed by hooks; ``update_plan``: the CPU/GPU
split; ``adam``: the fused Adam steps)."""
