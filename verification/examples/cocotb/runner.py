"""Builds bth_parser.v twice with Icarus Verilog (the parser, and its deliberately broken
variant) and runs test_bth_parser.py on each; exits non-zero unless both runs pass (the
good parser agrees with the model on every frame; the broken one is caught, by frame and
field). Run by ./run, which prepares the virtual environment and librnicvip."""

import sys
from pathlib import Path

from cocotb_tools.check_results import get_results
from cocotb_tools.runner import get_runner

here = Path(__file__).resolve().parent
build_root = Path(sys.argv[1])
failed = 0
for variant, broken in (("good", 0), ("broken", 1)):
    runner = get_runner("icarus")
    build_dir = build_root / variant
    runner.build(
        sources=[here / "bth_parser.v"],
        hdl_toplevel="bth_parser",
        parameters={"BROKEN": broken},
        build_dir=build_dir,
        timescale=("1ns", "1ps"),
        always=True,
    )
    results = runner.test(
        hdl_toplevel="bth_parser",
        test_module="test_bth_parser",
        build_dir=build_dir,
        test_dir=build_dir,
        extra_env={"BTH_PARSER_VARIANT": variant, "PYTHONPATH": str(here)},
    )
    tests, failures = get_results(results)
    print(f"cocotb example, {variant} parser: {tests} test(s), {failures} failed")
    if tests == 0 or failures:
        failed += 1
sys.exit(1 if failed else 0)
