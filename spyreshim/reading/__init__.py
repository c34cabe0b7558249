"""Reading what the shim wrote: traces (trace.py, tracecodec.py), leak reports (report.py), and what stacks mean (call order, frames, categories)."""
