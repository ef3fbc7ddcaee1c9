"""``fastdata doctor [--steps N | --seconds S] [--json FILE] [--html FILE] -- python train.py ARGS``."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    from fastdata.cli.measure import parse_duration

    d = sub.add_parser("doctor", help="is a training script input-bound? measured on the script, with the fix",
                       description="Run a training script unchanged for a bounded budget, measure how long its loop "
                                   "waits for each DataLoader batch and why (time in the dataset's __getitem__ and "
                                   "collate, worker CPU, bytes read, the copies of batches to a CUDA GPU), time the step on a "
                                   "copies of its first batches, time "
                                   "fastdata.loader on a sample of the dataset, and print the verdict, the projected "
                                   "gain and the commands (docs/doctor.md).")
    b = d.add_mutually_exclusive_group()
    b.add_argument("--steps", type=int, default=None, metavar="N", help="stop after N batches")
    b.add_argument("--seconds", type=parse_duration, default=None, metavar="S",
                   help="the whole run, start to verdict, takes about S seconds (e.g. 30s or 2m; default: 60s): about half of it measures the loop, the rest replays the step and projects fastdata; slow steps give fewer steps, and the report says its confidence")
    d.add_argument("--json", metavar="FILE", help="write the report as JSON")
    d.add_argument("--html", metavar="FILE", help="write an HTML page with a timeline of waits and steps")
    d.add_argument("--no-replay", action="store_true",
                   help="do not time the step on cached batches (the compute-only step is then estimated)")
    d.add_argument("--no-project", action="store_true", help="do not measure fastdata.loader on a sample")
    d.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                   help="the training command, after --")
    d.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from fastdata.measure.doctor import run

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    seconds = args.seconds if args.seconds is not None or args.steps is not None else 60.0
    report = run(cmd, steps=args.steps, seconds=seconds, json_path=args.json, html_path=args.html,
                 replay=not args.no_replay, project=not args.no_project)
    return 0 if report.get("bottleneck") is not None else 1
