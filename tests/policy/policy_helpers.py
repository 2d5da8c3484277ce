"""Policy dicts built straight from coefficients (no fit), for the policy tests."""

from ppprof.config import ChunkSettings
from ppprof.policy.rule import LatencyModel
from ppprof.policy.schema import SCHEMA_VERSION, make_table


def policy_dict(model: LatencyModel, status="dynamic", **settings) -> dict:
    s = ChunkSettings(**{"base_chunk_size": 8192, "context_len": 131072, "page_size": 64, **settings})
    target = model.target_ms(s.base_chunk_size)
    return {"schema_version": SCHEMA_VERSION, "status": status, "reason": "test", "latency_model": model.to_dict(),
            "settings": s.to_dict(), "target_latency_ms": target, "table": make_table(model, s, target, status),
            "provenance": {"world_size": 4, "layer_partition": [8, 8, 8, 8]}}
