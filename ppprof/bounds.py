"""The bounds and choices of settings that more than one layer checks, each defined once. Pure; imports nothing."""

DEVICES = ("cpu", "cuda")
"""What --device takes: cpu (gloo) or cuda (NCCL, one GPU a rank)."""
ATTENTION_BACKENDS = ("auto", "sdpa", "flashinfer", "reference")
"""What --attention-backend takes (ppprof.model.attention_kernels implements them, ppprof.specs.memory sizes them)."""
MAX_TOKENS = 2**31 - 1
"""The largest token count a setting takes (context, chunk, prefix, KV slots): servers index tokens with int32. What
a machine holds is checked before launch too (ppprof.run.memory_check)."""
MAX_STAGES = 1024
"""The most pipeline stages a command takes (ranks a node starts, --pp of plan, tune and bench)."""

POLICY_ENV = "PPPROF_POLICY"
"""The environment variable that names the policy file a server process loads (ppprof.sglang's start-up hook and
sizer; `ppprof export --server sglang` prints it)."""
TRACE_ENV = "PPPROF_TRACE"
"""The environment variable that names the forward trace a server process writes (ppprof.sglang's start-up hook
times each prefill forward of every rank; docs/forwards.md)."""
MAX_ASYNC_DEPTH = 16
"""The most micro-batch slots beyond the stages a server keeps in flight (--async-depth)."""
MLA_PREFIX_SPAN_TOKENS = 8192
"""The most cached tokens an MLA layer decompresses at once (ppprof.model.mla): a longer prefix is decompressed span
by span and the spans' attention merged by log-sum-exp, as servers bound their MLA prefill workspace, so the
transient stays at a chunk-sized span whatever the prefix (ppprof.specs.activation counts the span)."""
MAX_LAYERS = 4096
"""The most decoder layers a model spec holds (a pattern, repeat or num_hidden_layers beyond it is refused)."""
MAX_TP_SIZE = 64
"""The largest --tp-size taken (SGLang's largest published deployments run TP8-16 a stage)."""
