"""The words and JSON types of the contract's schema by part and field; ppprof.policy.contract_schema lays them out
from the classes (which keys, where, which required), refusing a field without an entry or an entry without a field."""

DESCRIPTIONS = {
    "settings": "The knobs of the next-chunk rule (named after SGLang's flags), resolved.",
    "table": "The history-only table a server reads when it passes only the prefix length: after prefix_len tokens, "
    "the next chunk is chunk_size[i] for the last i with prefix_len[i] <= prefix_len (a bisect). The same "
    "length, prefix_len starting at 0 and strictly increasing.",
    "prompt_table": "The prompt-aware rule: bands of prompt lengths, each with its breakpoint table over the prefix "
    "length and its merge length.",
    "load": "The under-load rule (schema 5, optional; absent: the idle rules answer at every load): whether the "
    "pipeline is full, read from the work present, and chunks of one latency while it is. While other "
    "requests have prefill tokens not yet scheduled (P > 0), the work W is P plus the prompt being sized (its "
    "length N, or L plus the idle chunk where N is unknown) and its share s = floor(W / (fill * slots)) "
    "aligned down to unit (one unit at least). With floor null the bound is M = min(full.bound_ms, t(0, s)) "
    "on the planning model (latency_model with calibration and overhead); where M is at most t(L, x), x the "
    "idle rules' chunk, the chunk is x (the pipeline is not full), else the larger of x and the bounded "
    "rule's chunk at L. With a floor F, M = min(full.bound_ms, max(t(0, F), t(0, s))) and the chunk is the "
    "bounded rule's at L. The bounded rule's chunk is the largest multiple of unit <= full.chunk_cap with "
    "t(L, .) <= M. The chunk is a batch's token budget, which the scheduler cuts to the chunked request's "
    "rest and fills with the other requests' tokens. Chosen by `ppprof fit` by simulating the serving "
    "scheduler on the planning model over a family of workloads at closed-loop levels up to 2 x slots and at "
    "Poisson loads: of the candidates never worse than the idle rules by more than 1% in any cell, the one "
    "whose worst loss against the best candidate is least, where below the idle rules' own (worst_loss, "
    "worst_at, idle_worst_loss; diagnostics.under_load holds every cell).",
    "full": "The full pipeline's bound and cap: the chunks while the pipeline is full are the bounded rule's at the "
    "share's latency, at most bound_ms and chunk_cap.",
    "overhead": "The per-chunk pipeline overhead: what a chunk costs on the real pipeline beyond its stages' timed "
    "forwards, added to every chunk's predicted latency wherever a TTFT is predicted or a chunk chosen.",
    "calibration": "The fitted latency's map onto the pipelined runs: linear_scale * (c + b x) + (the attention "
    "terms g L, a (2 L x + x^2), h L x^2 as fitted) + shift_ms is what the bottleneck stage's forwards "
    "took in the profile's own pipelined runs (lockstep probes run colder than a running pipeline, in "
    "the work on the weights). Wherever a TTFT is predicted or a chunk chosen, a chunk costs that plus "
    "overhead.ms_per_chunk. Absent in older files: linear_scale 1, shift 0.",
    "latency_model": "A latency model: t(L, x) = c + g*L + b*x + a*(2*L*x + x^2) + h*L*x^2 (L = prefix_len, x = "
    "chunk_size); a model lacks the terms its name does not list (they are 0).",
    "coefficients": "The model's coefficients by name, each {value, unit}.",
}
"""Each part's own description, by its key in the file."""
FIELDS = {
    "settings": {
        "base_chunk_size": {
            "description": "B: the first chunk, the size a static policy always uses "
            "(SGLang's --chunked-prefill-size).",
            "type": "integer",
            "minimum": 1,
        },
        "smooth_factor": {
            "description": "s in (0, 1]: the next chunk is B + s (x - B); 1 follows the model fully.",
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 1,
        },
        "page_size": {"description": "KV page size of the server, in tokens.", "type": "integer", "minimum": 1},
        "alignment": {
            "description": "Chunk sizes after the first are multiples of this (0 in a hand-written "
            "file: max(page_size, 64)).",
            "type": "integer",
            "minimum": 0,
        },
        "min_chunk_size": {
            "description": "Floor of a chunk before alignment (0: B // 4).",
            "type": "integer",
            "minimum": 0,
        },
        "max_chunk_size": {
            "description": "Cap of each chunk from the second on (the server's max prefill tokens; 0: B).",
            "type": "integer",
            "minimum": 0,
        },
        "context_len": {
            "description": "The model's context length: no prompt is longer; chunks are capped "
            "at context_len - prefix_len - context_margin.",
            "type": "integer",
            "minimum": 1,
        },
        "context_margin": {
            "description": "Tokens kept free at the end of the context (SGLang's 100).",
            "type": "integer",
            "minimum": 0,
        },
    },
    "table": {
        "prefix_len": {
            "description": "Where each entry starts: tokens already in the cache; [0, ...] strictly increasing.",
            "type": "array",
            "minItems": 1,
            "prefixItems": [{"const": 0}],
            "items": {"$ref": "#/$defs/count"},
        },
        "chunk_size": {
            "description": "The next chunk's size from that prefix length on, in tokens (>= 1).",
            "type": "array",
            "minItems": 1,
            "items": {"type": "integer", "minimum": 1},
        },
        "bound_ms": {
            "description": "The rule's bound on a chunk's predicted latency, ms (null: none, fixed "
            "chunks of chunk_cap).",
            "type": ["number", "null"],
        },
        "chunk_cap": {"description": "The rule's largest chunk, tokens.", "type": "integer", "minimum": 1},
    },
    "prompt_table": {
        "prompt_len": {
            "description": "Where each band starts: prompt lengths, [1, ...] strictly increasing.",
            "type": "array",
            "minItems": 1,
            "prefixItems": [{"const": 1}],
            "items": {"type": "integer", "minimum": 1},
        },
        "bound_ms": {
            "description": "Per band: the bound on a chunk's predicted latency, ms (null: none).",
            "type": "array",
            "items": {"type": ["number", "null"]},
        },
        "merge_len": {
            "description": "Per band: a rest of at most the chunk + this many tokens (and at "
            "most largest_chunk) is prefilled whole.",
            "type": "array",
            "items": {"$ref": "#/$defs/count"},
        },
        "prefix_len": {
            "description": "Per band: the breakpoints' prefix lengths, [0, ...] strictly increasing.",
            "type": "array",
            "items": {"$ref": "#/$defs/table/properties/prefix_len"},
        },
        "chunk_size": {
            "description": "Per band: the chunk size from each breakpoint on.",
            "type": "array",
            "items": {"$ref": "#/$defs/table/properties/chunk_size"},
        },
        "unit": {
            "description": "Chunk sizes are multiples of this (the alignment, coarsened for long contexts).",
            "type": "integer",
            "minimum": 1,
        },
        "largest_chunk": {
            "description": "The largest chunk a plan uses (the largest profiled, unless extrapolated).",
            "type": "integer",
            "minimum": 1,
        },
        "max_prompt_len": {
            "description": "The longest prompt the bands were built for (beyond it: the last band, extrapolated).",
            "type": "integer",
            "minimum": 1,
        },
    },
    "load": {
        "slots": {
            "description": "The pipeline's micro-batch slots the rule was chosen for: pp_size plus the "
            "async depth (SGLang's pp_async_batch_depth); a server with other slots gives "
            "its own.",
            "type": "integer",
            "minimum": 1,
        },
        "fill": {
            "description": "How many times over the work must fill the slots: the share is the work over fill x slots.",
            "type": "number",
            "exclusiveMinimum": 0,
        },
        "unit": {
            "description": "The alignment of the share, tokens (prompt_table.unit).",
            "type": "integer",
            "minimum": 1,
        },
        "floor": {
            "description": "null: the idle rules' chunk x is the least (the rule only grows chunks); a "
            "chunk size F: the least bound is t(0, F), and the chunk is the bounded rule's "
            "at M = min(full.bound_ms, max(t(0, F), t(0, s))) whatever x is.",
            "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 1}],
        },
        "full": None,  # the full pipeline's bound and cap: FIELDS['full'], nested
        "worst_loss": {
            "description": "The rule's worst loss against the best candidate over the workloads and "
            "levels it was chosen on (the larger of its throughput shortfall and its "
            "mean TTFT excess, relative); where: worst_at.",
            "type": "number",
        },
        "worst_at": {"description": "The workload and level of worst_loss.", "type": "string"},
        "idle_worst_loss": {"description": "The idle rules' worst loss on the same cells.", "type": "number"},
        "num_prompts": {
            "description": "Prompts a simulated level served at least (more at high concurrency), "
            "drawn from each workload.",
            "type": "integer",
            "minimum": 1,
        },
        "seed": {"description": "The seed they were drawn with.", "type": "integer", "minimum": 0},
        "async_depth": {
            "description": "Micro-batch slots beyond the stages the levels were served with (`ppprof "
            "fit --async-depth`).",
            "type": "integer",
            "minimum": 0,
        },
    },
    "full": {
        "bound_ms": {
            "description": "The full pipeline's bound: the largest predicted chunk latency its chunks "
            "allow (null: none, fixed chunks of the cap).",
            "oneOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 0}],
        },
        "chunk_cap": {"description": "The full pipeline's largest chunk.", "type": "integer", "minimum": 1},
    },
    "overhead": {
        "ms_per_chunk": {"description": "ms a chunk (>= 0).", "type": "number", "minimum": 0},
        "stderr_ms": {
            "description": "Its uncertainty, ms (null where not measured).",
            "type": ["number", "null"],
            "minimum": 0,
        },
        "source": {
            "description": "measured (the profile's pipelined runs, run.json pipeline_overhead), "
            "given (--overhead-ms) or none (not measured: 0).",
            "enum": ["measured", "given", "none"],
        },
    },
    "calibration": {
        "linear_scale": {
            "description": "Multiplies the fitted linear part c + b x.",
            "type": "number",
            "exclusiveMinimum": 0,
        },
        "shift_ms": {"description": "Added to every chunk, ms.", "type": "number"},
        "source": {
            "description": "measured (fitted on the pipelined runs' stage times) or none "
            "(linear_scale 1, shift 0; `why` says why).",
            "enum": ["measured", "none"],
        },
    },
}
"""Each field's type, lower bound and description, by part and key."""
COEFFICIENTS = {
    "a": {
        "description": "ms/token^2: the cost of a query-key pair. Never negative.",
        "value": {"description": "The value, >= 0.", "minimum": 0},
    },
    "b": {
        "description": "ms/token: the cost of a new token. Never negative.",
        "value": {"description": "The value, >= 0.", "minimum": 0},
    },
    "c": {"description": "ms: the fixed cost of a chunk (may be negative for SGLang's quadratic fit).", "value": None},
    "g": {
        "description": "ms/token: the cost per cached prefix token, per chunk (prefix and pairs models). Never "
        "negative.",
        "value": {"description": "The value, >= 0.", "minimum": 0},
    },
    "h": {
        "description": "ms/token^3: how a query-key pair's cost changes with the chunk size (pairs model): positive "
        "where a pair costs more in a larger chunk, negative where it costs less (a larger block of "
        "queries reuses each key, as CPU kernels do). A negative h keeps a + h x >= 0 up to twice "
        "the largest profiled chunk, so the latency grows with the chunk wherever a plan may go.",
        "value": {"description": "The value, of either sign."},
    },
}
"""Each coefficient's meaning and the bound of its value."""
TOP = {
    "schema_version": {
        "description": "Version of this layout; 5 (schema 4 with the full-pipeline under-load rule "
        "`load`), 4 (an under-load rule keyed by the count of pending requests, kept "
        "but not read: the policy answers at every load as with no load; refit it for "
        "the schema 5 rule) or 3 (the prompt-aware prompt_table, the history-only "
        "table, the per-chunk overhead; no load), all read. Versions 1 and 2 are not "
        "read: refit them with `ppprof fit`."
    },
    "status": {
        "description": "dynamic: the chunks follow the tables; static: every chunk is table.chunk_size[0], the "
        "best fixed chunk on the workload where the prompt-aware rule's predicted gain over it "
        "is below the threshold (or settings.base_chunk_size where the fit failed a quality "
        "gate); see reason."
    },
    "reason": {
        "description": "Why the policy has its status, in words (the gate that failed, or that all passed).",
        "type": "string",
        "minLength": 1,
    },
    "target_latency_ms": {
        "description": "SGLang's target T for its own rule (the variable latency of a "
        "base_chunk_size chunk on the fitted model; exports and the `greedy` "
        "strategy use it); null where there is no model. Positive in a dynamic "
        "policy; a static one records its model's T as fitted, which may be 0 or "
        "negative (its reason then says so).",
        "type": ["number", "null"],
    },
    "num_stages": {
        "description": "The pipeline stages the rules were chosen for (TTFT = sum t + (P - 1) max t).",
        "type": "integer",
        "minimum": 1,
    },
}
TOP_DESCRIPTIONS = {
    "latency_model": "The fitted chunk latency t(prefix_len, chunk_size) in ms; null where no model could be fitted "
    "(then status is static).",
    "load": "The under-load rule: schema 5's (`$defs/load`), or schema 4's, kept but not read.",
}
META = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ppprof dynamic-chunk policy (policy.json)",
    "description": "What `ppprof fit` and `ppprof profile` write and what a server reads to size each prefill chunk. "
    "A server that knows the prompt's length reads `prompt_table`: for a prompt of N tokens whose "
    "first L are in the cache, band i is the last with prompt_table.prompt_len[i] <= N, x = "
    "prompt_table.chunk_size[i][j] for the last j with prompt_table.prefix_len[i][j] <= L, and the "
    "next chunk is the rest N - L where that is at most min(x + prompt_table.merge_len[i], "
    "prompt_table.largest_chunk), else x. A server that knows the load (the other requests' prefill "
    "tokens not yet scheduled) reads `load` (schema 5) once the idle answer x is known: see its "
    "description. A server that passes only the prefix length reads `table`: table.chunk_size[i] for "
    "the last i with table.prefix_len[i] <= L (the last chunk takes the rest). Integers are JSON "
    "numbers without a fraction. Keys not named here are allowed and ignored by readers. Checks a "
    "schema cannot express (the tables are the bounded rules their bounds give on the coefficients and "
    "overhead) are made by `ppprof validate`.",
}
NAME = {
    "description": "quadratic (SGLang's f(l) = a l^2 + b l + c; coefficients a, b, c), prefix (ATOM's; a, b, c, g) or "
    "pairs (prefix + h L x^2; a, b, c, g, h)."
}
FORM = {"description": "The model's formula, in words.", "type": "string"}
COUNT = {"description": "A token count: an integer >= 0.", "type": "integer", "minimum": 0}
COEFFICIENT = {
    "description": "One coefficient: its value and unit.",
    "type": "object",
    "required": ["value", "unit"],
    "additionalProperties": False,
    "properties": {
        "value": {"description": "The coefficient (finite).", "type": "number"},
        "unit": {"description": "Its unit, ms and tokens.", "type": "string"},
    },
}
