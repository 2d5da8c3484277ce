"""Stand-ins for the packages of SGLang that cannot run on a CPU, for a process that runs SGLang's scheduler here
(tests/sglang/scheduler_run.py): the CUDA kernel package (sgl_kernel), the GPU compiler (triton) and torchvision.
A meta path finder answers their names with modules that have a proper __spec__ (transformers asks
importlib.util.find_spec); any attribute is a MagicMock (a function, a decorator) or, for triton's CamelCase names,
a class (torch checks isinstance against triton's JITFunction). Triton has no driver, as on a machine without a GPU.
Imported only by that process: never by ppprof, never by the pytest process (torch would take the stub for triton)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("sgl_kernel", "triton", "torchvision")
TRITON_VERSION = "3.9.0"
"""What the stub says of itself: SGLang's Mamba kernels choose their triton-3 code by the version at import."""


class StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper() and self.__name__.partition(".")[0] == "triton":
            value = type(name, (), {"__module__": self.__name__, "__init__": lambda s, *a, **k: None})
        else:
            from unittest.mock import MagicMock

            value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class NoDriver:
    """triton.runtime.driver.active where no GPU is: every use raises, as triton's does without a driver."""

    def __getattr__(self, name: str):
        raise RuntimeError("triton (stub): no GPU driver on this machine")


class StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []
        if module.__name__ == "triton":
            module.__version__ = TRITON_VERSION
            module.runtime = types.SimpleNamespace(driver=types.SimpleNamespace(active=NoDriver()))
        if module.__name__ == "triton.runtime":  # imported as a module, it takes the place of the attribute above
            module.driver = types.SimpleNamespace(active=NoDriver())


class StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, StubLoader(), is_package=True)
        return None


def install(sglang_site: str) -> None:
    """Stubs first on sys.meta_path, SGLang's install folder last on sys.path (after the venv's packages: its torch
    and numpy stay the ones in use), and transformers told that torchvision is absent."""
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder())
    if sglang_site not in sys.path:
        sys.path.append(sglang_site)
    import transformers.utils.import_utils as import_utils

    import_utils.is_torchvision_available = lambda: False
