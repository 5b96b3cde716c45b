"""Models fed from a tier: ``offload_layers`` (``layers``: layers streamed through a
ring of GPU buffers, with a per-layer optimizer) and ``offload_model`` (``model``: a
whole model trained with its optimizer state, and optionally its weights, on a tier).
Both lay blocks out in flat memory (``layout``) and stream weights with the one
mechanism (``ferry``: weights to the device, gradients home); ``update_split``: the
CPU/GPU split; ``adam``: the fused Adam steps."""
