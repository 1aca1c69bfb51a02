"""Models as data: one :class:`~hetflow.workloads.models.spec.ModelSpec` per model.

``spec.py`` is the interface and the registry (the built-ins by name, a user's model by import
path); each built-in model is a package beside it, torchtitan's way: ``config.py`` is its
config section (pydantic only: a config is read without torch), ``model.py`` the single-device
code, ``parallelize.py`` its tensor-parallel plan, ``__init__.py`` the ``SPEC`` that ties them to a loss, a dataset, metrics and serving.

    mlp/   digits classifier (``model: {kind: mlp, hidden: [128, 128]}``)
    gpt/   byte-level decoder (``model: {kind: gpt, layers: 2, ...}``)
"""
