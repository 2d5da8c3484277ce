"""SGLang reads the policy: a drop-in chunk sizer (`sizer`) for SGLang's scheduler, checked against the server it
runs in (`match`), put in place at interpreter start (`hook`, through ppprof-sglang.pth or `python -m ppprof.sglang`).

Imports nothing here: the start-up hook imports this package in every Python process where PPPROF_POLICY is set."""
