"""`ppprof compare`, one room: two policies measured side by side (`policies`), their samples cell by cell
(`cells`: the median latency ratios and the machine's pace), both judged against the tolerances (`verdict`) and
put in words (`render`); run folders or policy files resolved and compared (`runs`) and drawn (`plot`); a server's
forward trace judged against a policy per stage and prefix band (`forwards`). It reads ppprof.fit and ppprof.policy;
nothing below imports it (tests/test_layering.py). No torch."""
