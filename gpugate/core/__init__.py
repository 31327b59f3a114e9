"""The ground floor: helpers every layer may use and that know nothing of
GPUs or schedulers: records (dataclasses without their import cost),
bounded JSON, lazy regexes, hostlists, node names, Prometheus text, TOML
depth limits.  May import: nothing of gpugate's but gpugate.errors."""
