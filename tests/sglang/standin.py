"""What the sizer tests need of a server without SGLang installed: the committed policies with the model shapes
`ppprof fit` now records (from the run.json beside each), a model config with the fields SGLang's ModelConfig has,
a scheduler that builds the sizer as SGLang 0.5.23's does (the keywords and the attribute the contract test reads
there), and a runtime standing in for SGLang's parallel state."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from ppprof.fit.samples import model_shape
from ppprof.sglang import hook
from ppprof.sglang.sizer import PolicySizer, Runtime
from tests.tracked import tracked

REPO = Path(__file__).resolve().parents[2]
COMMITTED = [p for p in tracked("results/**/policy.json") if (p.parent / "run.json").is_file()]
"""Every committed policy of a profile (its run.json beside it; refits of another folder's samples left out)."""
IDS = [str(p.parent.relative_to(REPO / "results")) for p in COMMITTED]


def shaped(path: Path, out_dir: Path, **changes) -> Path:
    """The committed policy at `path` with provenance.model_shape from its run.json, then `changes` applied
    (dotted keys into the policy: "provenance.tp_size"); written into out_dir."""
    data = json.loads(path.read_text())
    data["provenance"]["model_shape"] = model_shape(json.loads((path.parent / "run.json").read_text())["model"])
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{path.parent.name}-policy.json"
    out.write_text(json.dumps(data))
    return out


def model_config(policy_path: Path, **changes) -> SimpleNamespace:
    """A model config with SGLang's ModelConfig fields, those of the model the policy was profiled on."""
    data = json.loads(policy_path.read_text())
    shape = dict(data["provenance"]["model_shape"])
    hf_config = SimpleNamespace(model_type=changes.pop("model_type", shape.pop("model_type")))
    shape.pop("model_type", None)
    fields = {"context_len": data["settings"]["context_len"], **shape, **changes}
    return SimpleNamespace(hf_config=hf_config, **fields)


def sizer_class(pp_size=2, tp_size=1, device_name=None, others=()) -> type[PolicySizer]:
    """PolicySizer on a server of `pp_size` stages; `others` are the other ranks' verdicts (problem, sha256), which
    SGLang's world group would gather."""

    class Sizer(PolicySizer):
        runtime = staticmethod(lambda device: Runtime(pp_size, tp_size, device_name, lambda mine: [mine, *others]))

    return Sizer


class Scheduler:
    """Builds the sizer as SGLang 0.5.23's Scheduler.maybe_init_dynamic_chunk_sizer does, and holds the request
    being chunked as `chunked_req` and those waiting for their first chunk as `waiting_queue`."""

    def __init__(self, cls: type, config, *, chunked_prefill_size, max_prefill_tokens=16384, page_size=1, device="cpu"):
        self.cls, self.model_config = cls, config
        self.chunked_prefill_size, self.max_prefill_tokens = chunked_prefill_size, max_prefill_tokens
        self.page_size, self.device = page_size, device
        self.chunked_req = None
        self.waiting_queue = []
        self.dynamic_chunk_sizer = None

    def maybe_init_dynamic_chunk_sizer(self):
        parts = {
            "model_runner": None,
            "model_config": self.model_config,
            "tree_cache": None,
            "req_to_token_pool": None,
            "token_to_kv_pool_allocator": None,
            "spec_algorithm": None,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "page_size": self.page_size,
            "device": self.device,
        }
        assert tuple(parts) == hook.SIZER_KWARGS
        sizer = self.cls(**parts)
        if sizer.profile_and_fit():
            self.dynamic_chunk_sizer = sizer
        return sizer


def request(prefix_len: int, prompt_len: int) -> SimpleNamespace:
    """The fields the sizer reads of SGLang's Req (ppprof.sglang.sizer.REQ_FIELDS)."""
    return SimpleNamespace(prefix_len=prefix_len, origin_input_ids=[0] * prompt_len, output_ids=[])
