"""AMD Instinct: the AMD part of baseline.toml, AMD facts, amd-smi and
amdgpu sysfs/kernel-log parsers and probes, the AMD judges, runbook, GPU
reset, evidence, metrics, capture and the simulated AMD node.  Each module
may import what its layer may (gpugate.vendors); this __init__ imports
nothing."""
