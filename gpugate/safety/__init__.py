"""Fail-safe I/O: what may be trusted (StrictModes-style ownership checks),
capped and atomic reads and writes, forked and timed external commands,
run locks only root can take, JSON state files, the signing key of
published proofs.  May import: gpugate.core (and gpugate.errors)."""
