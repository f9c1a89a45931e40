"""``vtools env``: print everything a device bug report needs (versions, devices, AMP policy, cpu
budget, environment variables); with ``--device`` it reports on that device and fails in one
line when it is unusable.

Its options, and what ``--help`` says of it: vtools/cli/env_flags.py.
"""

from __future__ import annotations

import sys

from vtools.errors import UsageError, fail
from vtools.observe.env_report import collect, format_report
from vtools.options.declare import ParsedOptions
from vtools.runtime import preflight
from vtools.runtime.device import resolve_device


def run(args: ParsedOptions) -> int:
    report = collect(args.device, tuple(args.device_modules or ()))
    print(format_report(report))
    sys.stdout.flush()
    if args.check:
        return check(args.device, tuple(args.device_modules or ()))
    if " unusable: " in str(report["device"]):
        fail(str(report["device"]), prog="python -m vtools env")
    return 0


def check(spec: str, device_modules: tuple[str, ...]) -> int:
    """Every preflight finding for ``spec``, one line each; exit 2 when any would stop a run."""
    findings = preflight.before_device(spec)
    try:
        findings += preflight.after_device(resolve_device(spec, device_modules), spec)
    except UsageError as err:
        if not any(finding.severity == "error" for finding in findings):  # else most likely their consequence
            findings.append(preflight.Finding("error", str(err)))
    for finding in findings:
        print(finding.line())
    errors = sum(finding.severity == "error" for finding in findings)
    print(f"preflight: {errors} error(s), {len(findings) - errors} note(s)")
    return 2 if errors else 0
