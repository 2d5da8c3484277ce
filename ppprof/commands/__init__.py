"""The command layer: one module per command; each parses its options, calls one function of the layers below and
lets ppprof.cli turn a ValueError into the one-line error. COMMANDS is the order `ppprof --help` lists them in."""

from ppprof.commands.bench import bench
from ppprof.commands.calibrate import calibrate_command
from ppprof.commands.compare import compare_command
from ppprof.commands.export import export_command
from ppprof.commands.fit import fit_command
from ppprof.commands.model import model
from ppprof.commands.plan import plan_command
from ppprof.commands.profile import profile
from ppprof.commands.serve_bench import serve_bench_command
from ppprof.commands.tune import tune_command
from ppprof.commands.validate import validate_command

COMMANDS = (
    model,
    profile,
    fit_command,
    plan_command,
    export_command,
    tune_command,
    validate_command,
    bench,
    serve_bench_command,
    compare_command,
    calibrate_command,
)
