"""Trace-driven simulation: record once with the real models (trace.py), then replay the
real router and cascade on any cost profile (simulate.py): this machine's, a GPU's, or a
roofline model of a device that is not here (roofline.py)."""
