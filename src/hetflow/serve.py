"""Ray Serve's own tooling for hetflow serving configs (see :mod:`hetflow.workloads.serve.builder`).

    serve run hetflow.serve:app config=examples/serve_digits.yaml
"""

from hetflow.workloads.serve.builder import app, serve_config_document

__all__ = ["app", "serve_config_document"]
