"""Emulated NVIDIA GPUs and vLLM servers for a kwok cluster: DCGM series from a load model."""
