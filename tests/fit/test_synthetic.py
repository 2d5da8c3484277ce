"""The synthetic run folders (ppprof.fit.synthetic): their run.json says the stages as `ppprof profile` writes them
(pp_size; world_size the ranks, one a stage), and the fit reads the stages from it, and from a run.json of older
versions that holds world_size alone."""

import json

from ppprof.fit.build import fit
from ppprof.fit.samples import read_run
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.io import atomic_write_json
from ppprof.policy.rule import LatencyModel

TRUE = LatencyModel("prefix", a=2e-6, b=0.008, c=1.5, g=8e-5)


def test_a_synthetic_run_json_says_its_stages_as_the_profile_does(tmp_path):
    probes = SyntheticProbes(base_chunk_size=512, prefixes=[1024, 4096], chunk_sizes=[128, 256], pp_size=4)
    samples = write_run_dir(
        tmp_path, make_samples(TRUE, probes), SyntheticRun(base_chunk_size=512, pp_size=4, num_layers=8)
    )
    run = read_run(samples)
    assert (run["pp_size"], run["tp_size"], run["world_size"], run["layer_partition"]) == (4, 1, 4, [2, 2, 2, 2])
    _, policy = fit(samples, policy_options={"load_rule": False})
    assert policy["num_stages"] == 4 and policy["report"]["provenance"]["pp_size"] == 4, policy["report"]["provenance"]
    older = {k: v for k, v in run.items() if k not in ("pp_size", "tp_size", "layer_partition")}
    atomic_write_json(tmp_path / "run.json", older)  # a run.json of older versions: world_size alone
    _, policy = fit(samples, policy_options={"load_rule": False})
    assert policy["num_stages"] == 4 and policy["report"]["provenance"]["pp_size"] == 4, json.dumps(
        policy["report"]["provenance"]
    )
