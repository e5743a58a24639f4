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
    """A number with a decimal point is a fraction ("0.8"; ``options.FRACTION``);
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
                      help="fxremat memory_budget: bytes ('24MiB', '1000000') or a fraction from the "
                           "least-memory plan (0.0) to the unconstrained one (1.0), e.g. '0.9'")
    demo.set_defaults(command_parser=demo)  # for errors found after parsing
    explain = commands.add_parser(
        "explain", help="write an HTML report of the plans in a debug_dir (timeline, plan by layer, trade-off)",
        description="Write report.html for each compiled graph whose plan a debug_dir holds (compile with "
                    "options={'debug_dir': DIR} and run a step), and an index DIR/report.html. With --model, "
                    "plan a model first (no training step): a factory 'package.module:function' returning "
                    "(model, example_inputs).",
    )
    explain.add_argument("debug_dir", metavar="DEBUG_DIR", help="the debug_dir the plans were written to")
    explain.add_argument("--model", metavar="MODULE:FACTORY",
                         help="plan this model into DEBUG_DIR first: FACTORY() returns (model, example_inputs)")
    explain.add_argument("--budget", type=_budget, help="with --model: memory_budget (bytes, '6GiB', or a fraction '0.5')")
    explain.add_argument("--solver", help="with --model: the solver (default auto)")
    explain.add_argument("--compiler", choices=("inductor", "eager"),
                         help="with --model: whose memory timeline to plan for (default inductor)")
    explain.set_defaults(command_parser=explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "explain":
        return _explain(args)
    from .demo import QUICK, DemoConfig, run_demo

    settings = dict(QUICK) if args.quick else {}
    settings.update({f.name: getattr(args, f.name) for f in dataclasses.fields(DemoConfig)
                     if getattr(args, f.name, None) is not None})
    config = DemoConfig(**settings)
    if config.dim % config.heads:
        args.command_parser.error(f"--dim {config.dim} is not a multiple of --heads {config.heads}")
    return run_demo(config)


def _explain(args) -> int:
    import sys

    from .report import ExplainError, write_reports

    if args.model is None and any(v is not None for v in (args.budget, args.solver, args.compiler)):
        args.command_parser.error("--budget, --solver and --compiler go with --model")
    if args.model is not None:
        from .planning import plan_model

        options = {k: v for k, v in (("memory_budget", args.budget), ("solver", args.solver),
                                     ("compiler", args.compiler)) if v is not None}
        try:
            model, example_inputs = _factory(args.model)()
            plan_model(model, example_inputs, {**options, "debug_dir": args.debug_dir})
        except (ValueError, ImportError, AttributeError, TypeError) as error:
            print(f"fxremat explain: {error}", file=sys.stderr)
            return 1
    try:
        paths = write_reports(args.debug_dir)
    except ExplainError as error:
        print(str(error), file=sys.stderr)
        return 1
    print(f"fxremat explain: wrote {len(paths) - 1} graph report(s); open {paths[0]}")
    return 0


def _factory(spec: str):
    """``package.module:function`` -> the function."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--model {spec!r}: expected 'package.module:function'")
    factory = getattr(importlib.import_module(module), name)
    if not callable(factory):
        raise TypeError(f"--model {spec!r}: {name} is not callable")
    return factory
