"""NVIDIA GPUs: NVML and nvidia-smi probes, their shared evaluation, Xid, NVML events."""
