"""`entrypoint.py doctor`: the image checks itself, in a user's CI and on a new node.

    command.py   the subcommand: argv, exit codes, text and JSON output
    facts.py     the environment report (labels, locks, Python, versions, driver, devices)
    checks.py    which checks run, in-process checks, and the plan of probe steps
    runner.py    probe processes: every step bounded by a timeout, a hang becomes a fail
    probe.py     what runs inside a probe process (imports, Triton, TE, device work)

Nothing here imports torch or any framework in the doctor's own process: every such
import happens in a probe process, where a crash or a hang is contained and timed.
"""
