"""The settings a policy is fitted with: the latency-model choices, and the rule's settings (ChunkSettings) of the
profile run.json records, the options given to `ppprof fit` winning."""

from __future__ import annotations

from pathlib import Path

from ppprof.config import ChunkSettings, PolicyOptions, ProfileConfig
from ppprof.config.workload import parse_prompt_spec
from ppprof.policy.rule import MODEL_NAMES

LATENCY_MODEL_CHOICES = MODEL_NAMES + ("auto",)


def resolve_settings(run: dict | None, samples_path: Path, **given) -> ChunkSettings:
    """The rule's settings: the options given (not None) win; the rest come from the profile's recorded settings
    (run.json's config, read back typed), else from ChunkSettings' defaults (then --base-chunk-size is needed)."""
    if run is not None and "config" in run:
        return ProfileConfig.from_dict(run["config"], f"run.json beside {samples_path}").chunk_settings(**given)
    if given.get("base_chunk_size") is None:
        raise ValueError(
            f"--base-chunk-size is required: there is no run.json with config.base_chunk_size beside {samples_path}"
        )
    return ChunkSettings(**{k: v for k, v in given.items() if v is not None})


def resolve_policy_options(run: dict | None, samples_path: Path, context_len: int, **given) -> PolicyOptions:
    """What the rules are chosen with: the options given (not None) win; the workload and the least gain come from
    the profile's recorded settings where it has them, else PolicyOptions' defaults. The workload (--prompt-lens) is
    read here, once, against the policy's context length."""
    recorded = {}
    if run is not None and isinstance(run.get("config"), dict):
        config = run["config"]
        recorded = {k: config[k] for k in ("prompt_lens", "min_gain") if config.get(k) is not None}
    try:
        chosen = recorded | {k: v for k, v in given.items() if v is not None}
        spec = chosen.pop("prompt_lens", None)
        workload = None if spec is None else parse_prompt_spec(spec, context_len)
        return PolicyOptions(**chosen, workload=workload)
    except ValueError as e:
        where = "" if set(given) >= set(recorded) else f" (run.json beside {samples_path})"
        raise ValueError(f"{e}{where}") from None
