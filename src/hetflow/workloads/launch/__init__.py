"""``hetflow launch``: users' unchanged torchrun scripts on hetflow's placement (see launcher.py)."""

from hetflow.workloads.launch.spec import LaunchSpec

__all__ = ["LaunchSpec", "launch"]


def launch(spec: LaunchSpec, **kwargs):  # noqa: ANN201 - imports Ray on first use
    from hetflow.workloads.launch.launcher import launch as _launch

    return _launch(spec, **kwargs)
