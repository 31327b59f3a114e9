"""Simulated nodes and fleets: a fake file-system root (/proc, /sys,
/dev/kmsg), simulated external executables with the real ones' names,
exits and errors, and fleets built from baseline.toml (`gpugate sim`).
Only the boundary is simulated; the production path runs above it.  May
import: every layer below it (core .. fleet)."""
