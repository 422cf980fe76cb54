"""Local Linear Attention: the exact reference (any device) and the Triton kernel (GPU)."""
from .reference import lla_reference, lla_weights

__all__ = ["lla_reference", "lla_weights"]
