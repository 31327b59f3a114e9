"""The data model, pure: baseline.toml and gpugate.toml (schemas, loading,
validation), a node's facts, findings, reasons, verdicts, what a job's
user can cause (influence), a node's answers to the sweep.  No I/O beyond
reading the two TOML files.  May import: gpugate.core, gpugate.safety, and
the vendors' model modules (gpugate.vendors.<vendor>.facts/baseline/runbook)."""
