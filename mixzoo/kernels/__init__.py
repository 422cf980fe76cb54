"""Our own kernels, each with a plain-PyTorch reference beside it. Imports nothing of mixzoo."""
