"""Models as data: one :class:`~hetflow.workloads.models.spec.ModelSpec` per model.

``spec.py`` is the interface and the registry (the built-ins by name, a user's model by import
path); each built-in model is a package beside it, torchtitan's way: ``model.py`` is the
single-device code (and its config section), ``parallelize.py`` its tensor-parallel plan,
``__init__.py`` the ``SPEC`` that ties them to a loss, a dataset, metrics and serving.

    mlp/   digits classifier (``model: {kind: mlp, hidden: [128, 128]}``)
    gpt/   byte-level decoder (``model: {kind: gpt, layers: 2, ...}``)
"""
