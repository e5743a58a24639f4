"""The ``fxremat`` command (also ``python -m fxremat``)."""

from __future__ import annotations

import argparse
import dataclasses
import re

from . import __version__


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _budget(text: str) -> float | str:
    """A number with a decimal point is a fraction of the unconstrained plan ("0.8");
    anything else is bytes, with an optional unit ("6GiB", "500MB", "1048576")."""
    from .options import OptionError, Options

    value: float | str = float(text) if re.fullmatch(r"\s*[0-9]*\.[0-9]+\s*", text) else text
    try:
        Options.from_user({"memory_budget": value})
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fxremat", description="fxremat: rematerialization planning for torch.compile.")
    parser.add_argument("--version", action="version", version=f"fxremat {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="train a small GPT eagerly, with torch.compile, and with fxremat; compare them",
        description="Train a small GPT with eager PyTorch, torch.compile (Inductor) and "
                    "torch.compile(backend='fxremat') from the same initial weights, and print step time, "
                    "saved-activation bytes and measured (and, for fxremat, predicted) peak memory.",
    )
    demo.add_argument("--quick", action="store_true",
                      help="a tiny model and 3 timed steps, for a smoke run; explicit options below still apply")
    demo.add_argument("--steps", type=_positive_int, help="timed steps per strategy (default 10)")
    demo.add_argument("--layers", type=_positive_int, help="transformer blocks (default 2)")
    demo.add_argument("--batch", type=_positive_int, help="sequences per batch (default 8)")
    demo.add_argument("--seq", type=_positive_int, help="sequence length (default 64)")
    demo.add_argument("--dim", type=_positive_int, help="model width (default 128)")
    demo.add_argument("--heads", type=_positive_int, help="attention heads; must divide --dim (default 4)")
    demo.add_argument("--threads", type=_positive_int,
                      help="CPU threads (torch.set_num_threads; default: torch's). On a busy machine, "
                           "Inductor's OpenMP kernels can slow down badly with more threads than free cores")
    demo.add_argument("--budget", type=_budget,
                      help="fxremat memory_budget: bytes ('24MiB', '1000000') or a fraction of the "
                           "unconstrained plan's peak ('0.9')")
    demo.set_defaults(command_parser=demo)  # for errors found after parsing
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # args.command == "demo", the only command so far.
    from .demo import QUICK, DemoConfig, run_demo

    settings = dict(QUICK) if args.quick else {}
    settings.update({f.name: getattr(args, f.name) for f in dataclasses.fields(DemoConfig)
                     if getattr(args, f.name, None) is not None})
    config = DemoConfig(**settings)
    if config.dim % config.heads:
        args.command_parser.error(f"--dim {config.dim} is not a multiple of --heads {config.heads}")
    return run_demo(config)
