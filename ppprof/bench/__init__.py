"""`ppprof bench`: real chunked prefills of synthetic prompts through the pipeline under each chunking strategy, and
what they are worth: measured and replayed TTFT against the planner's prediction."""
