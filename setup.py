"""The one build step pyproject.toml cannot say: ppprof-sglang.pth goes to the top of the wheel (site-packages once
installed), where Python runs it at every start; it imports ppprof's SGLang hook only where PPPROF_POLICY is set
(docs/sglang.md). Everything else about the package is in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path("ppprof") / "sglang" / "ppprof-sglang.pth"


class BuildWithStartupHook(build_py):
    """build_py, plus the start-up hook's .pth at the root of the build (editable installs skip it: there
    `python -m ppprof.sglang` or the .pth copied by hand turns the hook on)."""

    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PTH.name)]


setup(cmdclass={"build_py": BuildWithStartupHook})
