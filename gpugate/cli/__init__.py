"""The `gpugate` command: click groups that parse, call the library and
render (render, sweep_render).  Nothing is decided here.  May import: any
layer (it is the top one)."""
