"""One home per GPU vendor (gpugate.vendors.nvidia, gpugate.vendors.amd):
every vendor-specific parser, probe, judge, runbook, reset, evidence,
metric, capture and simulation.  A vendor's home is a vertical slice: each
module stands at the layer its name says (facts/baseline/runbook: model;
parse_*: parsers; probe_*: probes; judge*: judges; reset/evidence/metrics:
node; capture: fleet; sim_*: sim), declared in tests/test_layout.py LAYERS,
so it may import what that layer may import.  gpugate.vendors.seam is the
one interface the node calls (reset, evidence, metrics, runbook).  This
__init__ imports nothing: importing one module must not load a vendor."""
