"""The drain budget, pure rules and the keeper's memory: how many nodes of a
partition may be out at once (rules), the pins allowance (pins,
keeper_pins), the pools each held node counts in (pools), the spans the
keeper drained (memory), and the proofs a published finding carries
(proofs).  The node uses it to decide whether to publish; the keeper to
decide what to drain.  May import: the layers below it, schedulers included
(the published-finding format of gpugate.slurm.pending)."""
