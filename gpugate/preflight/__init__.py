"""The preflight (docs/explanation/preflight-design.md): an active proof on a job's
fresh allocation, in gpugate's prolog (PrologFlags=Alloc), before the job's
own code.  ``select`` decides which jobs get one (pure); ``node`` runs a
node's own part and judges it.

May import: the layers below it (core .. budget); the node agent runs it, it
never imports the node agent."""
