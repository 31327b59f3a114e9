"""The budget keeper on the controller: one run every 30 s reads the fleet
once, drains the published nodes each partition's budget allows, and gives
back what it must (run); on Kubernetes one replica leads through a Lease
(lead) and keeps its memory on it (lease_memory).  May import: the layers
below it: the budget, the schedulers, the model; never the node agent's
code."""
