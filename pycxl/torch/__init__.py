"""The PyTorch side, above the GPU driver floor: CUDA tensors on a tier and the spill
(``tier``), and models fed from a tier (``offload``). Loaded only when used: importing
pycxl imports no torch, and ``pycxl.gpu`` never imports this package."""
