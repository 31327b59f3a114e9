"""NVIDIA: NVML through nvidia-ml-py (nvmlread, pynvml_loader, probe_nvml,
and nvml_sim, the simulated library a simulated node loads in its place),
and NVIDIA's Xid catalog.  DCGM and Xid judging
are shared judges (gpugate.judges).  Each module may import what its layer
may (gpugate.vendors); this __init__ imports nothing."""
