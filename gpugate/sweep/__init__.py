"""`gpugate sweep`: batched reconvergence, verification before RESUME, a
crash-safe journal.  snapshot -> plan (pure) -> engine (journaled steps)."""
