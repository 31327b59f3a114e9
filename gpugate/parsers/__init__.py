"""Parsers, pure: the text of a tool or a kernel file in, facts out (nvidia-smi,
dcgmi, nccl-tests, ibstat, /proc and /sys files, the kernel log).  No
I/O here.  May import: gpugate.core, gpugate.safety, gpugate.model."""
