"""Fake vendor-library modules (pynvml, amdsmi) for the discovery tests."""
