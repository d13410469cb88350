# lit configuration of the piper suite; driven by run_lit.sh under `bazel test`.
import os

import lit.formats

config.name = "piper"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
# Inputs/ folders hold files that RUN lines read (strategies, models).
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
# Bazel's runfiles tree is read-only: lit's Output/ (and every %t) goes under
# TEST_TMPDIR.
config.test_exec_root = os.path.join(
    os.environ.get("TEST_TMPDIR", config.test_source_root), "lit-out")

# run_lit.sh passes a directory holding piper-opt, piperc, FileCheck and not.
tools_dir = lit_config.params.get("tools_dir")
if not tools_dir:
    lit_config.fatal(
        "pass --param tools_dir=<dir with piper-opt, piperc, FileCheck, not>")
config.environment["PATH"] = os.pathsep.join(
    [tools_dir, config.environment.get("PATH", "/usr/bin:/bin")])
