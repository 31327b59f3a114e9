"""`gpugate demo` (filled in with the test cluster)."""
