"""Exports to other tools' formats: PyTorch's memory_viz, pprof, the Trace Event Format, PyTorch's memory timeline."""
