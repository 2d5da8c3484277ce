"""The elastic launcher's arguments: torchrun's options passed on, the job's arguments last."""

import json

import pytest

from ppprof.config import ProfileConfig
from ppprof.dist.launch import launcher_argv, num_nodes


def test_launcher_passes_torchrun_options_and_the_resolved_config():
    cfg = ProfileConfig(nproc_per_node=3, base_chunk_size=64)
    worker = ["profile", "--resolved-config", json.dumps(cfg.to_dict())]
    argv = launcher_argv(3, {"nnodes": "2", "node_rank": "1", "rdzv_endpoint": "h:1", "standalone": False}, worker)
    assert argv[:2] == ["--nproc-per-node", "3"]
    assert "--standalone" not in argv
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--module"):argv.index("--module") + 3] == ["--module", "ppprof", "profile"]
    resolved = json.loads(argv[argv.index("--resolved-config") + 1])
    assert resolved["base_chunk_size"] == 64 and resolved["nproc_per_node"] == 3
    local = launcher_argv(3, {}, worker + ["--inject-fault", "skip-mamba-release"])
    assert "--standalone" in local and local[-2:] == ["--inject-fault", "skip-mamba-release"]


@pytest.mark.parametrize("nnodes,expected", [(None, 1), ("2", 2), ("3:3", 3)])
def test_node_count(nnodes, expected):
    assert num_nodes(nnodes) == expected


@pytest.mark.parametrize("nnodes", ["1:4", "x", "0"])
def test_elastic_or_bad_node_counts_are_refused(nnodes):
    with pytest.raises(ValueError, match="--nnodes"):
        num_nodes(nnodes)
