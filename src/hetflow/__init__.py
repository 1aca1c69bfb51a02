"""hetflow: run AI work on clusters of mixed accelerators (ROCm, CUDA, CPU) on top of Ray.

Layers (imports only point downward; see CONTRIBUTING.md):
cli -> workflow -> workloads -> runtime -> [pure core: scheduling, sim, accelerators, core]
"""

__version__ = "0.1.0"
