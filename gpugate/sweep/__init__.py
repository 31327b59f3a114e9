"""`gpugate sweep`: batched reconvergence, verification before RESUME, a
crash-safe journal.  snapshot -> plan (pure) -> engine (journaled steps).

May import: the layers below it (core .. node: its proofs run the node's own
check)."""
