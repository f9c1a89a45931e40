"""``python -m vtools <command>``: project utilities (env, bench, shards, export, plot)."""

from __future__ import annotations

import sys

from vtools.errors import run_cli


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m vtools {env,bench,shards,export,plot} [options]\n\n"
              "  env     print versions, devices, AMP policy and environment for bug reports\n"
              "  bench   measure train/validate/inference throughput against a plain baseline\n"
              "  shards  write an image folder as tar shards (or parquet) for --dataset wds/ (hfds/)\n"
              "  export  write a model as ONNX and check onnxruntime against PyTorch on real images\n"
              "  plot    draw loss, top-1 and lr of one or several training runs into a PNG")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "env":
        from vtools.envreport import main

        return main(rest)
    if command == "bench":
        from vtools.benchmark import main as bench

        return bench(rest)
    if command == "plot":
        from vtools.curves import main as plot

        return plot(rest)
    if command == "export":
        from vtools.export import main as export

        return export(rest)
    if command == "shards":
        from vtools.shards import main as shards

        return shards(rest)
    from vtools.errors import UsageError

    raise UsageError(f"unknown command {command!r} (available: env, bench, shards, export, plot)")


if __name__ == "__main__":
    run_cli(_main)
